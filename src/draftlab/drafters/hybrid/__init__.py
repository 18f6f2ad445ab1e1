"""The prompt-lookup tree and the draft-model tree merged into one token tree."""
