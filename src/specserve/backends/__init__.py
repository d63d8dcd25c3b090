"""Forward-pass engines behind one interface (see base.py)."""
from .base import Context, MemoryUse, Model, VocabInfo, common_prefix, sync_and_eval, sync_prefix

__all__ = ["Context", "MemoryUse", "Model", "VocabInfo", "common_prefix", "load_model", "sync_and_eval", "sync_prefix"]


def load_model(path: str, n_gpu_layers: int = 0, n_threads: int | None = None, flag: str = "-ngl",
               exact: bool = False) -> Model:
    """Load a GGUF model with the llama.cpp backend. n_gpu_layers other than 0 on a build that cannot
    offload raises devices.OffloadUnavailable (a ValueError), naming `flag` and the install line that fixes it.
    exact: its passes of any size round as one-token passes do, checked at load (backends/exact.py)."""
    from .devices import require_offload
    from .llama_cpp import LlamaCppModel

    require_offload({flag: n_gpu_layers})
    return LlamaCppModel(path, n_gpu_layers=n_gpu_layers, n_threads=n_threads, exact=exact)
