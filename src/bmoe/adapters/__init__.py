"""Adapters: the code that talks to the outside world (llama.cpp, files, the protocol)."""
