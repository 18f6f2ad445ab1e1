"""Engines: what decodes a generation. They sit beside `decode`, below `bench`.

`hf` is draftlab's own loop (decode/). `vllm` runs the same methods through vLLM's offline
`LLM` API (engines/vllm.py). `llamacpp` runs our own loop over a GGUF model that llama.cpp
evaluates (models/llamacpp.py): a model of another engine, not another loop. Both return a `Generation` with `GenerationStats`, so the runner and
the reports never ask which engine made a record; the engine is one of the variant's settings.
"""

ENGINES = ("hf", "vllm", "llamacpp")
