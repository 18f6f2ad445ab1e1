"""llama.cpp through llama-cpp-python: a GGUF target in our loop, the GGUF export, the probe, its own
prompt lookup as a peer."""
