"""A small draft model: speculative sampling (sps), its token trees (sps-tree) and BiLD."""
