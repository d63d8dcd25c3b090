"""Embeddings for every API that asks for them (OpenAI's, llama-server's, Ollama's): inputs tokenized, each
embedded on the engine thread, between the generation steps.

The embedding context (backends/embedding.py) is the target's, created by the first request: every
llama.cpp pass of this process runs on the one engine thread (core/batcher.py), the embeddings' too, so
none runs beside a generation pass, and one input at a time, so that a long list of inputs delays the
streams in flight by one input's pass at most. A request counts as in flight for a drain, and a sleeping
server closes the context before it frees the weights (core/sleep.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import anyio
import numpy as np

from ...backends.embedding import Embedder
from ..http.errors import ApiError, bad_request
from .scheduler import draining

MAX_INPUTS = 2048  # inputs a request may send (OpenAI's limit): each is a pass on the engine thread
Tokenize = Callable[[object, str], list[int]]  # (an input, the field it came in) -> its tokens

@dataclass(frozen=True)
class Embedded:
    vectors: list[np.ndarray]  # one per input, pooled, not normalized
    n_tokens: int  # tokens of all inputs (after truncation)
    seconds: float


def embedder_of(state) -> Embedder:
    """The server's embedder, made on first use (it reads the model's pooling: a reranker gets 501)."""
    if state.embedder is None:
        try:
            state.embedder = Embedder(state.engine.target, state.engine.n_ctx)
        except ValueError as e:
            raise ApiError(501, f"embeddings are not supported: {e}", code="not_supported") from None
    return state.embedder


def tokenized(state, inputs: list, tokenize: Tokenize, truncate: bool, param: str) -> list[list[int]]:
    """Each input as `tokenize` makes its tokens (the API's reading: a string, token ids, or a mix as
    llama-server takes them). Past the embedder's length: cut there (`truncate`), else 400."""
    embedder = embedder_of(state)
    out = []
    for i, item in enumerate(inputs):
        tokens = tokenize(item, f"{param}[{i}]")
        if not tokens:
            raise bad_request(f"{param}[{i}] is empty: there is nothing to embed", f"{param}[{i}]")
        if len(tokens) > embedder.max_tokens:
            if not truncate:
                raise bad_request(f"{param}[{i}] is {len(tokens)} tokens; embeddings take at most "
                                  f"{embedder.max_tokens}", f"{param}[{i}]", "context_length_exceeded")
            tokens = tokens[:embedder.max_tokens]
        out.append(tokens)
    return out


def text_tokens(model) -> Tokenize:
    """A string's tokens with the model's special tokens (BOS where it adds one) and control tokens read
    from the text, as llama-server tokenizes what it embeds."""
    def tokenize(item, param: str) -> list[int]:
        if not isinstance(item, str):
            raise bad_request(f"{param} must be a string", param)
        return model.tokenize(item, add_special=True, parse_special=True)
    return tokenize


async def embed(state, inputs: list, tokenize: Tokenize | None = None, truncate: bool = False,
                param: str = "input") -> Embedded:
    """The inputs' embeddings, computed on the engine thread (ApiError: 400 for an input, 503 draining).
    tokenize: how an input becomes tokens (default: a string, text_tokens)."""
    tokenize = tokenize or text_tokens(state.engine.target)
    if len(inputs) > MAX_INPUTS:
        raise bad_request(f"{param} has {len(inputs)} inputs; at most {MAX_INPUTS} a request", param)
    scheduler = state.scheduler
    if scheduler.draining:
        raise draining()
    scheduler.enter()  # a drain waits for it
    try:
        t0 = time.perf_counter()
        tokens = await anyio.to_thread.run_sync(tokenized, state, inputs, tokenize, truncate, param)
        embedder = state.embedder
        vectors = []
        for one in tokens:  # one pass each, between the generation steps
            try:
                vectors += await scheduler.worker.run(embedder.embed, [one])
            except MemoryError as e:  # the context could not be created
                raise ApiError(503, f"embeddings are unavailable: {e}", code="unavailable") from None
        return Embedded(vectors, sum(map(len, tokens)), time.perf_counter() - t0)
    finally:
        scheduler.leave()

