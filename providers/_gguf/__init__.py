"""Engine pieces of the in-process GGUF lane (llama-cpp-python)."""
