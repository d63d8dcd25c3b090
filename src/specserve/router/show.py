"""Ollama's POST /api/show for a model the router has not loaded, answered from its GGUF header.

Clients call /api/show for every model they list (Continue reads the context length, Open WebUI the
capabilities): loading each one to answer would start a process per model and unload the ones in
use. So an unloaded model is described from its header, with the single-model server's own helpers
(apis/ollama/models.py) over a stand-in that holds the header's metadata and token texts; a loaded
one is asked (its child knows its template and context as it serves them).
"""
from __future__ import annotations

import functools
from pathlib import Path
from types import SimpleNamespace

from ..gguf_meta import GGUFError, read_metadata
from ..server.apis.ollama.models import capabilities, details, model_info
from ..server.http.errors import ApiError
from .pool import Model

_TEMPLATE_KEY = "tokenizer.chat_template"
_TOKENS_KEY = "tokenizer.ggml.tokens"


class HeaderModel:
    """What the show helpers read of a loaded model (path, metadata, vocabulary texts), from the header."""

    def __init__(self, path: str):
        self.path = path
        header = read_metadata(path, full_arrays=(_TOKENS_KEY,), max_array_items=1)
        texts = header.get(_TOKENS_KEY)
        texts = texts if isinstance(texts, list) else []
        # as llama.cpp gives a loaded model's metadata: scalars as strings (file_type 0 is "0", which is F32)
        self.metadata = {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in header.items()
                         if isinstance(v, (str, int, float, bool))}
        self.vocab = SimpleNamespace(token_texts=texts, n_vocab=len(texts))


@functools.lru_cache(maxsize=64)
def _header(path: str, mtime_ns: int) -> HeaderModel:
    return HeaderModel(path)


def _ctx(args: list[str]) -> int:
    """The context its child would run at: its -c/--ctx-size (the last given), else the server's default."""
    n = 4096
    for flag, value in zip(args, args[1:]):
        if flag in ("-c", "--ctx-size") and value.isdigit():
            n = int(value)
    return n


def show_unloaded(model: Model) -> dict:
    """/api/show's answer for `model`, from its header; 422 where the header cannot be read."""
    path = model.found.path
    try:
        target = _header(str(path), Path(path).stat().st_mtime_ns)
    except (OSError, GGUFError, TypeError) as e:
        raise ApiError(422, f"model '{model.name}': cannot read its GGUF header: {e}", "model") from None
    return {"modelfile": f"# served by specserve's router\nFROM {model.name}\n",
            "parameters": f"num_ctx {_ctx(model.args)}", "template": target.metadata.get(_TEMPLATE_KEY) or "",
            "details": details(target), "model_info": model_info(target), "capabilities": capabilities(target)}
