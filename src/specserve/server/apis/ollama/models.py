"""Ollama's model endpoints over the one served model: GET /api/tags, POST /api/show, GET /api/ps,
GET /api/version; and what this server does not do (pull, push, create, copy, delete): 501 with
Ollama's `{"error": ...}` saying why.

The details come from the GGUF header the server read at start (format gguf, family: the architecture,
parameter_size: the header's size label, else counted from its tensors, quantization_level: its file
type). Every name the served model answers to (its name, --alias, the profiles) is listed as a model.
Models are named by the file's name, never its path: a path tells a client about the host's directories.
"""
from __future__ import annotations

import hashlib
import os
from datetime import datetime, timezone
from pathlib import Path

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .... import __version__
from ....draft_choice import of_engine
from ....fim import fim_tokens
from ....gguf_meta import GGUFError, read_header, tensor_infos
from ...core.reasoning import template_tags
from ...http.body import read_json
from ...http.endpoint import Endpoint
from ...http.errors import ApiError
from ...state import ServerState, server_of
from ..shared.builder import ServerView
from ..shared.validation import Fields, parse
from .request import model_known, not_found, served_names
from .serving import error_body

# The Ollama release whose API these endpoints follow: clients compare /api/version with theirs to
# decide what they may send (structured outputs, thinking, tools)
OLLAMA_VERSION = "0.12.6"
_TEMPLATE_KEY = "tokenizer.chat_template"
# llama.cpp's LLAMA_FTYPE values, as Ollama names them
_FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
               11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
               18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S",
               25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M",
               32: "BF16", 36: "TQ1_0", 37: "TQ2_0"}
_NOT_HERE = ("this server serves the local GGUF file it was started with (specserve serve -m FILE): it does not "
             "pull, push, create, copy or delete models")
_UNSUPPORTED = {"/api/pull": ("POST",), "/api/push": ("POST",), "/api/create": ("POST",),
                "/api/copy": ("POST",), "/api/delete": ("DELETE",)}


def routes() -> list[Endpoint]:
    return [Endpoint("/api/tags", tags, ("GET",), error_body, needs_model=False),
            Endpoint("/api/ps", ps, ("GET",), error_body, needs_model=False),
            Endpoint("/api/version", version, ("GET",), error_body, needs_model=False),
            Endpoint("/api/show", show, ("POST",), error_body),
            *(Endpoint(path, not_here, methods, error_body, needs_model=False)
              for path, methods in _UNSUPPORTED.items())]


def parameter_count(target) -> int | None:
    """The weights counted from the GGUF header's tensors (None where it cannot be read)."""
    try:
        return sum(t.n_elements for t in tensor_infos(target.path))
    except (OSError, GGUFError):
        return None


def parameter_size(target) -> str:
    """Ollama's parameter_size: the header's size label ("1.5B"), else counted from its tensors (a read
    of the header, which /api/tags, polled by clients, does only for a file without the label)."""
    label = target.metadata.get("general.size_label")
    n = None if label else parameter_count(target)
    if label or n is None:
        return label or ""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)


def details(target) -> dict:
    m = target.metadata
    arch = m.get("general.architecture", "")
    file_type = m.get("general.file_type")
    quant = _FILE_TYPES.get(int(file_type), str(file_type)) if str(file_type or "").isdigit() else ""
    return {"parent_model": "", "format": "gguf", "family": arch, "families": [arch] if arch else None,
            "parameter_size": parameter_size(target), "quantization_level": quant}


def _file(target) -> tuple[int, str, str]:
    """(size in bytes, modified_at, digest) of the model's file. The digest names the file as served (its
    name, size and time), not its bytes: hashing gigabytes for a listing is not worth it."""
    st = os.stat(target.path)
    modified = datetime.fromtimestamp(st.st_mtime, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    digest = hashlib.sha256(f"{Path(target.path).name}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()
    return st.st_size, modified, digest


def _names(state: ServerState) -> list[str]:
    return list(dict.fromkeys([state.settings.model_name, *state.settings.aliases, *state.profiles]))


async def tags(request: Request) -> Response:
    state = server_of(request)
    target = state.engine.target
    size, modified, digest = _file(target)
    info = details(target)
    return JSONResponse({"models": [{"name": name, "model": name, "modified_at": modified, "size": size,
                                     "digest": digest, "details": info} for name in _names(state)]})


async def ps(request: Request) -> Response:
    """The served model, loaded for the server's life: it never expires (keep_alive is not read)."""
    state = server_of(request)
    target = state.engine.target
    size, _, digest = _file(target)  # the weights' file: the slots' caches are /props' and /metrics' to tell
    info = details(target)
    return JSONResponse({"models": [{"name": name, "model": name, "size": size, "digest": digest, "details": info,
                                     # size_vram: not measured here (0), whatever -ngl offloads
                                     "expires_at": "9999-12-31T23:59:59Z", "size_vram": 0,
                                     "context_length": state.engine.n_ctx,
                                     "draft_choice": of_engine(state.engine)} for name in _names(state)[:1]]})


async def version(request: Request) -> Response:
    return JSONResponse({"version": OLLAMA_VERSION, "specserve": __version__})


class ShowRequest(Fields):
    model: str | None = None
    name: str | None = None  # the older clients' spelling of `model`
    verbose: bool | None = None


def capabilities(target) -> list[str]:
    """What Ollama's clients check before they send: tools where the template renders them, thinking
    where it reasons, insert where the vocabulary has fill-in-the-middle tokens."""
    template = target.metadata.get(_TEMPLATE_KEY) or ""
    fim = fim_tokens(target)
    return ["completion", *(["tools"] if "tools" in template else []),
            *(["thinking"] if template_tags(target) is not None else []),
            *(["insert"] if None not in (fim.pre, fim.suf, fim.mid) else [])]


def model_info(target) -> dict:
    """The header's metadata with its types (clients read `<arch>.context_length` as a number), its arrays
    null as Ollama shows them unless asked (the vocabulary), its chat template apart (under `template`),
    and the parameter count."""
    try:
        header = read_header(target.path, max_array_items=1)
    except (OSError, GGUFError):
        return {}
    info = {k: None if not isinstance(v, (str, int, float, bool)) else v
            for k, v in header.metadata.items() if k != _TEMPLATE_KEY}
    info["general.parameter_count"] = sum(t.n_elements for t in header.tensors)
    return info


async def show(request: Request) -> Response:
    state = server_of(request)
    body = await read_json(request, state.settings.max_body, state.settings.read_timeout)
    fields = parse(ShowRequest, body)
    name = fields.model or fields.name
    if not name:
        raise ApiError(400, "model is required", "model")
    if not model_known(name, served_names(ServerView.of(state, None))):
        raise not_found(name)
    target = state.engine.target
    profile = state.profiles.get(name.removesuffix(":latest")) or state.profiles[state.settings.model_name]
    # num_ctx: the context this server runs at, which clients that read it (Continue) send back as
    # options.num_ctx, in place of the model's trained context_length that model_info holds
    parameters = "\n".join(f"{k} {v}" for k, v in {"num_ctx": state.engine.n_ctx, **profile.sampling}.items())
    _, modified, _ = _file(target)
    return JSONResponse({"modelfile": f"# served by specserve\nFROM {Path(target.path).name}\n",
                         "parameters": parameters, "template": target.metadata.get(_TEMPLATE_KEY) or "",
                         "details": details(target), "model_info": model_info(target),
                         "capabilities": capabilities(target), "modified_at": modified,
                         "draft_choice": of_engine(state.engine)})


async def not_here(request: Request) -> Response:
    what = request.url.path.removeprefix("/api/").split("/")[0]
    raise ApiError(501, f"/api/{what} is not supported: {_NOT_HERE}", code="not_supported")
