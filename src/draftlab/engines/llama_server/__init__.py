"""llama-server as an engine: the server built from llama-cpp-python's vendored llama.cpp, started and
stopped by draftlab, with its own drafters (n-gram, a draft model, EAGLE-3) as methods."""
