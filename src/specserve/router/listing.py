"""How the router lists its models: llama-server's `/models` entries (OpenAI's /v1/models with a
`status`) and Ollama's /api/tags and /api/ps entries.

Models are named, never shown by path (a path tells a client about the host's folders). Ollama's details
come from the GGUF header as the single-model server gives them, read once per file; a model from Ollama's store
keeps its blob's sha256 as its digest, as Ollama shows it.
"""
from __future__ import annotations

import functools
import hashlib
import os
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

from ..gguf_meta import GGUFError, read_metadata
from ..server.apis.ollama.models import details
from .pool import Model, redact



def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def openai_entry(model: Model, created: float) -> dict:
    chosen = (model.draft_choice or {}).get("chosen")
    entry = {"id": model.name, "object": "model", "created": int(created), "owned_by": "specserve",
             "store": model.found.store, "draft": chosen or (model.draft and redact(model.draft)),
             "status": model.status()}
    if model.draft_choice is not None:  # known once loaded: the choice, why, and the other candidates
        entry["draft_choice"] = model.draft_choice
    if model.memory is not None:  # estimated at its first load under --models-memory
        entry["memory"] = {"bytes": model.memory, "estimate": model.memory_note}
    return entry


@functools.lru_cache(maxsize=1024)
def _details(path: str, mtime_ns: int) -> dict:
    """Ollama's details of the file, as the single-model server gives them (its helper, over the header)."""
    try:
        meta = read_metadata(path, max_array_items=1)
    except (OSError, GGUFError, TypeError):
        return {"parent_model": "", "format": "gguf", "family": "", "families": None, "parameter_size": "",
                "quantization_level": ""}
    strings = {k: str(v) for k, v in meta.items() if isinstance(v, (str, int, float))}  # as llama.cpp's
    return details(SimpleNamespace(path=path, metadata=strings))


def _file(model: Model) -> tuple[str, str, dict]:
    """(modified_at, digest, details) of the model's file."""
    path = model.found.path
    try:
        st = os.stat(path)
    except (OSError, TypeError):
        return now(), "", {"format": "gguf"}
    modified = datetime.fromtimestamp(st.st_mtime, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    name = Path(path).name
    if model.found.store == "ollama" and name.startswith("sha256-"):
        digest = name.removeprefix("sha256-")
    else:  # names the file as found (name, size, time): hashing gigabytes for a listing is not worth it
        digest = hashlib.sha256(f"{name}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()
    return modified, digest, _details(str(path), st.st_mtime_ns)


def ollama_entry(model: Model, running: bool = False) -> dict:
    modified, digest, details = _file(model)
    entry = {"name": model.name, "model": model.name, "size": model.found.size, "digest": digest,
             "details": details}
    if running:  # a loaded model stays loaded until unloaded or evicted: it never expires by time
        entry.update(expires_at="9999-12-31T23:59:59Z", size_vram=0)
    else:
        entry["modified_at"] = modified
    return entry
