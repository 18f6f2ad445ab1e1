"""SuffixDecoding (Oliaro et al. 2024): trees from the prompt and earlier outputs of the run."""
