"""vLLM's offline LLM API running the same methods (its speculative_config per method)."""
