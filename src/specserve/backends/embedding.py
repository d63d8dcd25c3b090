"""Embeddings of a loaded model: one pooled vector per input, from a llama.cpp context of its own.

The context is created on first use, on the target's weights (no second copy), with embeddings on and
the pooling the GGUF asks for (`<arch>.pooling_type`: an embedding model's mean, CLS or last token); a
causal language model, whose GGUF names none, is pooled by the mean of its last hidden states, as
Ollama and llama-server's `--pooling mean` do. Generation's contexts are untouched. Its caller runs it
on the thread that runs every other pass (the server's engine thread), never beside them.

One input is one decode: llama.cpp pools over a micro-batch, so the micro-batch holds a whole input,
and the context is at most `MAX_TOKENS` tokens, llama-server's default micro-batch and so the longest
input it embeds by default. Its compute buffer grows with it, a causal LM's logits over the vocabulary
for every token included: for the reference target (1.5B, 152k vocabulary) the context takes 322 MiB at
512 tokens and 1.3 GiB at 2048. Vectors come back as llama.cpp gives them; normalizing is each API's
business (`normalize`).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

import llama_cpp as C

from .llama_native import DecodeThreads, NativeContext, NativeModel, mib_sum

MAX_TOKENS = 512  # the longest input embedded whole (the context's size and micro-batch): llama-server's default
POOLING_NAMES = {C.LLAMA_POOLING_TYPE_NONE: "none", C.LLAMA_POOLING_TYPE_MEAN: "mean",
                 C.LLAMA_POOLING_TYPE_CLS: "cls", C.LLAMA_POOLING_TYPE_LAST: "last",
                 C.LLAMA_POOLING_TYPE_RANK: "rank"}


def pooling_of(metadata: dict) -> int:
    """llama.cpp's pooling type for a model: what its GGUF says, mean where it says none or nothing (a
    causal LM). A reranker's (rank) scores pairs; it embeds nothing: ValueError."""
    arch = metadata.get("general.architecture", "")
    raw = metadata.get(f"{arch}.pooling_type")
    kind = int(raw) if raw is not None and str(raw).lstrip("-").isdigit() else C.LLAMA_POOLING_TYPE_NONE
    if kind == C.LLAMA_POOLING_TYPE_RANK:
        raise ValueError("this model is a reranker (pooling rank): it scores pairs and computes no embeddings")
    return kind if kind in POOLING_NAMES and kind != C.LLAMA_POOLING_TYPE_NONE else C.LLAMA_POOLING_TYPE_MEAN


def normalize(v: np.ndarray, p: int = 2) -> np.ndarray:
    """v scaled as llama.cpp's common_embd_normalize (llama-server's `embd_normalize`): p = 2, Euclidean
    (v / ||v||_2, what Ollama's /api/embed and OpenAI's answers are); -1 none; 0 max-absolute scaled to
    int16's range; 1 taxicab; p > 2 the p-norm. A zero vector stays zero."""
    a = np.abs(v.astype(np.float64))
    total = {-1: 1.0, 0: a.max(initial=0.0) / 32760.0, 1: a.sum(), 2: float(np.sqrt((a * a).sum()))}.get(p)
    if total is None:
        total = float((a ** p).sum() ** (1.0 / p))
    return (v * (1.0 / total if total > 0 else 0.0)).astype(np.float32)


class EmbeddingContext(NativeContext):
    """A context with embeddings on, pooled, one sequence; decodes one input at a time."""

    def __init__(self, model: NativeModel, n_tokens: int, pooling: int):
        self.model, self.n_tokens, self.pooling = model, n_tokens, pooling
        self._ctx = None
        self._open(n_tokens)

    def _open(self, n: int) -> None:
        self._open_native(self.model, n, n, 1, f"{n} tokens for embeddings", n, pooling=self.pooling)
        self.n_embd = C.llama_model_n_embd(self.model.handle)
        self.bytes = mib_sum(r"(?:KV|compute) buffer size", self.load_log)

    def embed(self, tokens: Sequence[int]) -> np.ndarray:
        """[n_embd] float32: the pooled embedding of `tokens` (1 to n_tokens of them)."""
        n = len(tokens)
        if not 0 < n <= self.n_tokens:
            raise ValueError(f"an input of {n} tokens: embeddings take 1 to {self.n_tokens}")
        C.llama_memory_clear(self._mem, True)
        b = self._batch
        for i, t in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0], b.logits[i] = t, i, 1, 0, True
        b.n_tokens = n
        DecodeThreads.note()
        rc = C.llama_decode(self._ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with status {rc} on an input of {n} tokens")
        ptr = C.llama_get_embeddings_seq(self._ctx, 0)
        if not ptr:
            raise RuntimeError("llama.cpp gave no pooled embedding")
        return np.ctypeslib.as_array(ptr, shape=(self.n_embd,)).copy()


class Embedder:
    """A model's embeddings, its context created on first use and closed with `close` (before the model's
    weights are freed: a sleeping server closes it first, and the next input opens it again)."""

    def __init__(self, model, max_tokens: int):
        self.model = model
        self.max_tokens = max(1, min(max_tokens, MAX_TOKENS, getattr(model, "n_ctx_train", 0) or MAX_TOKENS))
        self.pooling = pooling_of(model.metadata)  # ValueError for a reranker, said at the first request
        self._ctx: EmbeddingContext | None = None

    @property
    def pooling_name(self) -> str:
        return POOLING_NAMES[self.pooling]

    def embed(self, inputs: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """One pooled, unnormalized vector per input (each 1 to max_tokens tokens)."""
        if self._ctx is None:
            self._ctx = EmbeddingContext(self.model, self.max_tokens, self.pooling)
        return [self._ctx.embed(tokens) for tokens in inputs]

    @property
    def context_bytes(self) -> int:
        return self._ctx.bytes if self._ctx is not None else 0

    def close(self) -> None:
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None
