"""Ollama's embeddings: POST /api/embed (`input`: a string or an array of them -> `embeddings`, each
L2-normalized, as Ollama's) and the older POST /api/embeddings (`prompt` -> `embedding`, as the model
gives it, not normalized, as Ollama's). Inputs past the embedding context are cut there unless
`truncate` is false (then 400), as Ollama does; `dimensions` keeps the first N values, normalized again.
An empty input embeds nothing (an empty list), as Ollama answers it.
"""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ....backends.embedding import normalize
from ...core.embeddings import embed
from ...state import server_of
from ...http.body import read_json
from ...http.endpoint import Endpoint
from ...http.errors import ApiError, bad_request
from ..shared.builder import ServerView
from .request import model_known, not_found, served_names
from .serving import error_body


def routes() -> list[Endpoint]:
    return [Endpoint("/api/embed", embed_many, render_error=error_body),
            Endpoint("/api/embeddings", embed_one, render_error=error_body)]


async def _body(request: Request) -> tuple[object, dict]:
    state = server_of(request)
    body = await read_json(request, state.settings.max_body, state.settings.read_timeout)
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise ApiError(400, "model is required", "model")
    if not model_known(name, served_names(ServerView.of(state, None))):
        raise not_found(name)
    return state, body


def _bool(body: dict, key: str, default: bool) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise bad_request(f"{key} must be a boolean", key)
    return value


async def embed_many(request: Request) -> Response:
    state, body = await _body(request)
    raw = body.get("input", [])
    inputs = [raw] if isinstance(raw, str) else raw
    if not isinstance(inputs, list) or not all(isinstance(x, str) for x in inputs):
        raise bad_request("input must be a string or an array of strings", "input")
    dims = body.get("dimensions")
    if dims is not None and (not isinstance(dims, int) or isinstance(dims, bool) or dims < 1):
        raise bad_request("dimensions must be a positive integer", "dimensions")
    inputs = [x for x in inputs if x]  # Ollama embeds no empty string
    if not inputs:
        return JSONResponse({"model": body["model"], "embeddings": []})
    done = await embed(state, inputs, truncate=_bool(body, "truncate", True))
    if dims is not None and dims > done.vectors[0].shape[0]:
        raise bad_request(f"dimensions must be at most the model's {done.vectors[0].shape[0]}", "dimensions")
    vectors = [normalize(v[:dims] if dims else v).tolist() for v in done.vectors]
    ns = int(done.seconds * 1e9)
    return JSONResponse({"model": body["model"], "embeddings": vectors, "total_duration": ns,
                         "load_duration": 0, "prompt_eval_count": done.n_tokens})


async def embed_one(request: Request) -> Response:
    state, body = await _body(request)
    prompt = body.get("prompt", "")
    if not isinstance(prompt, str):
        raise bad_request("prompt must be a string", "prompt")
    if not prompt:
        return JSONResponse({"embedding": []})
    done = await embed(state, [prompt], truncate=True, param="prompt")
    return JSONResponse({"embedding": done.vectors[0].tolist()})
