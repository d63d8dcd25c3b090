"""Forward-pass engines behind one interface (see base.py)."""
from .base import Context, MemoryUse, Model, VocabInfo, common_prefix, sync_and_eval, sync_prefix

__all__ = ["Context", "MemoryUse", "Model", "VocabInfo", "common_prefix", "load_model", "sync_and_eval", "sync_prefix"]


def load_model(path: str, n_gpu_layers: int = 0, n_threads: int | None = None) -> Model:
    """Load a GGUF model with the llama.cpp backend."""
    from .llama_cpp import LlamaCppModel

    return LlamaCppModel(path, n_gpu_layers=n_gpu_layers, n_threads=n_threads)
