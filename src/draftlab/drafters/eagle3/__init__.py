"""EAGLE-3 (Li et al. 2025): a one-layer head drafting from the target's hidden states, its runtime
cache, its speculators-format files, its features, training and distillation."""
