"""specserve: speculative decoding for local GGUF models, as a library, a CLI and a server."""
__version__ = "0.1.0"
