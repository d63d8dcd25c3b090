"""Embeddings in OpenAI's shape (POST /v1/embeddings) and llama-server's own (POST /embedding, /embeddings).

As llama-server: `input` (or, on its own paths, `content`) is a string, token ids, or an array of
either; vectors are L2-normalized unless `embd_normalize` says otherwise (-1 none, 0 max-absolute, 1
taxicab, 2 Euclidean, p > 2 a p-norm); `encoding_format` "base64" gives each vector's float32 bytes
(what the `openai` client asks for). `dimensions` keeps a vector's first N values, normalized again (as
OpenAI's shortened embeddings). The OpenAI answer is {object: list, data: [{object: embedding, index,
embedding}], model, usage}; llama-server's own is [{index, embedding: [[...]]}] (one row: pooled).
An input past the embedding context is a 400; the `model` named is any (the served one answers).
"""
from __future__ import annotations

import base64

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...core.embeddings import embed
from ...state import server_of
from ...http.body import read_json
from ...http.endpoint import Endpoint
from ...http.errors import bad_request
from ....backends.embedding import normalize
from ..llama.templates import tokenize_mixed


def routes() -> list[Endpoint]:
    return [Endpoint("/v1/embeddings", openai_embeddings), Endpoint("/embedding", llama_embeddings),
            Endpoint("/embeddings", llama_embeddings)]


def inputs_of(value, param: str) -> list:
    """A string, a list of token ids (one input), or a list of strings / token lists (several)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        if value and all(isinstance(x, int) and not isinstance(x, bool) for x in value):
            return [value]
        if all(isinstance(x, (str, list)) for x in value):
            return value
    raise bad_request(f"{param} must be a string, an array of strings, or token ids", param)


def _options(body: dict) -> tuple[int, bool, int | None]:
    p = body.get("embd_normalize", 2)
    if not isinstance(p, int) or isinstance(p, bool) or p < -1:
        raise bad_request("embd_normalize must be an integer >= -1", "embd_normalize")
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise bad_request('encoding_format must be "float" or "base64"', "encoding_format")
    dims = body.get("dimensions")
    if dims is not None and (not isinstance(dims, int) or isinstance(dims, bool) or dims < 1):
        raise bad_request("dimensions must be a positive integer", "dimensions")
    return p, fmt == "base64", dims


def shaped(v: np.ndarray, p: int, dims: int | None) -> np.ndarray:
    if dims is not None:
        if dims > v.shape[0]:
            raise bad_request(f"dimensions must be at most the model's {v.shape[0]}", "dimensions")
        v = v[:dims]
    return normalize(v, p)


async def _embedded(request: Request, oai: bool):
    state = server_of(request)
    body = await read_json(request, state.settings.max_body, state.settings.read_timeout)
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    key = "input" if "input" in body or oai else "content"
    if body.get(key) is None:
        raise bad_request('"input" or "content" must be provided' if not oai else "input is required", key)
    inputs = inputs_of(body[key], key)
    if not inputs:
        raise bad_request(f"{key} must not be empty", key)
    p, b64, dims = _options(body)
    target = state.engine.target
    done = await embed(state, inputs, lambda item, param: tokenize_mixed(target, item, True, True, param), param=key)
    return state, body, done, [shaped(v, p, dims) for v in done.vectors], b64


async def openai_embeddings(request: Request) -> Response:
    state, body, done, vectors, b64 = await _embedded(request, True)
    data = [{"object": "embedding", "index": i,
             "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode() if b64 else v.tolist()}
            for i, v in enumerate(vectors)]
    model = body.get("model") if isinstance(body.get("model"), str) else state.settings.model_name
    return JSONResponse({"object": "list", "data": data, "model": model,
                         "usage": {"prompt_tokens": done.n_tokens, "total_tokens": done.n_tokens}})


async def llama_embeddings(request: Request) -> Response:
    _, _, _, vectors, _ = await _embedded(request, False)
    return JSONResponse([{"index": i, "embedding": [v.tolist()]} for i, v in enumerate(vectors)])
