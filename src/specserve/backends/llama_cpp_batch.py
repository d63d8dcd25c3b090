"""Several sequences in one llama.cpp context, decoded together.

A server's slots share one context per model: sequence i (llama.cpp's seq_id) is slot
i's cache, and one `llama_decode` can carry tokens of every sequence (each slot's last
token plus its draft, or a chunk of a prompt), with logits asked for only where they
are needed. The KV cache is unified (one pool of cells, attention masked by sequence):
llama.cpp then splits a batch into micro-batches by size only, whereas per-sequence
streams would split it into equal-length pieces per sequence (a 9-token verification
next to a 1-token decode would take two passes).

`SeqContext` is one sequence seen as an ordinary `Context` (eval, truncate, tokens), so
everything written for a single sequence (prefix reuse, the drafters) works unchanged on
it; `SharedContext.decode` is the batched verb.
"""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np

import llama_cpp as C

from .base import MemoryUse, common_prefix
from .cache_reuse import drop_cells, reuse_chunks
from .llama_native import DecodeThreads, NativeContext, NativeModel


class SharedContext(NativeContext):
    """n_seq sequences of up to n_ctx tokens each, at most n_batch tokens per decode (llama.cpp computes
    them in micro-batches of n_ubatch)."""

    def __init__(self, model: NativeModel, n_ctx: int, n_seq: int, n_batch: int = 512, n_ubatch: int | None = None):
        if n_seq < 1:
            raise ValueError(f"need at least one sequence, got {n_seq}")
        self.model = model
        self.n_ctx = n_ctx  # per sequence
        self.n_seq = n_seq
        self.n_batch = min(n_batch, n_ctx * n_seq)
        self.n_vocab = model.vocab.n_vocab
        self.can_rollback = model.can_rollback
        self._open_native(model, n_ctx * n_seq, self.n_batch, n_seq, f"{n_seq} x {n_ctx} tokens", n_ubatch)
        self.seqs = [SeqContext(self, i) for i in range(n_seq)]
        self._open = n_seq

    def decode(self, parts: Sequence[tuple["SeqContext", Sequence[int], str | None]]) -> list[np.ndarray | None]:
        """One forward pass over every part's tokens, appended to its sequence.

        A part's logits: "all" -> [len(tokens), n_vocab], "last" -> [1, n_vocab], None -> no
        logits. The arrays are views of llama.cpp's buffer, valid until the next decode.
        """
        total = sum(len(t) for _, t, _ in parts)
        if not 0 < total <= self.n_batch:
            raise ValueError(f"a batch holds 1 to {self.n_batch} tokens, got {total}")
        b, i, rows = self._batch, 0, []
        for seq, tokens, logits in parts:
            start = len(seq.tokens)
            if start + len(tokens) > self.n_ctx:
                raise ValueError(f"context full: {start} + {len(tokens)} tokens > n_ctx {self.n_ctx}")
            last = len(tokens) - 1
            for j, t in enumerate(tokens):
                b.token[i] = t
                b.pos[i] = start + j
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = seq.seq_id
                b.logits[i] = logits == "all" or (logits == "last" and j == last)
                i += 1
            rows.append(len(tokens) if logits == "all" else 1 if logits == "last" else 0)
        b.n_tokens = total
        DecodeThreads.note()
        t0 = time.perf_counter()
        rc = self._decode(b)
        dt = time.perf_counter() - t0
        if rc != 0:
            for seq, _, _ in parts:  # nothing of this batch stays in any cache
                C.llama_memory_seq_rm(self._mem, seq.seq_id, len(seq.tokens), -1)
            raise RuntimeError(f"llama_decode failed with status {rc}")
        for seq, tokens, _ in parts:
            seq.tokens.extend(tokens)
            seq.t_eval += dt
        n_out = sum(rows)
        out = self._logits(n_out) if n_out else None
        result, r = [], 0
        for n in rows:
            result.append(out[r:r + n] if n else None)
            r += n
        return result

    def _seq_rm(self, seq_id: int, start: int) -> bool:
        return bool(C.llama_memory_seq_rm(self._mem, seq_id, start, -1))

    def _release(self) -> None:
        self._open -= 1
        if self._open == 0:
            self.close()


class SeqContext:
    """One sequence of a SharedContext, behaving as a single-sequence Context."""

    def __init__(self, shared: SharedContext, seq_id: int):
        self.shared = shared
        self.seq_id = seq_id
        self.n_ctx = shared.n_ctx
        self.tokens: list[int] = []
        self.t_eval = 0.0
        self._closed = False

    def eval(self, tokens: Sequence[int], logits: str = "last") -> np.ndarray:
        """As LlamaCppContext.eval: in passes of at most n_batch tokens, this sequence alone."""
        n, n_batch = len(tokens), self.shared.n_batch
        if n == 0:
            raise ValueError("eval needs at least one token")
        if len(self.tokens) + n > self.n_ctx:
            raise ValueError(f"context full: {len(self.tokens)} + {n} tokens > n_ctx {self.n_ctx}")
        if logits == "all" and n > n_batch:
            raise ValueError(f"cannot return logits for {n} tokens in one pass (n_batch {n_batch})")
        out = None
        for s in range(0, n, n_batch):
            chunk = tokens[s:s + n_batch]
            last = s + len(chunk) == n
            out = self.shared.decode([(self, chunk, logits if last or logits == "all" else None)])[0]
        return out

    def truncate(self, n: int) -> None:
        if n >= len(self.tokens):
            return
        if self.shared._seq_rm(self.seq_id, n):
            del self.tokens[n:]
            return
        keep = self.tokens[:n]  # a recurrent state cannot drop a suffix: start over
        if not self.shared._seq_rm(self.seq_id, 0):
            raise RuntimeError(f"llama.cpp could not clear a sequence of {self.shared.model.path}")
        self.tokens = []
        if keep:
            self.eval(keep, logits="last")

    def reuse(self, tokens: Sequence[int], n_min: int) -> int:
        """As LlamaCppContext.reuse: the cache keeps its prefix and moved runs of >= n_min tokens of
        `tokens`, then holds tokens[:n]; return n."""
        s = self.shared
        n = reuse_chunks(s._mem, self.seq_id, self.tokens, tokens, n_min) if n_min > 0 and s.can_rollback else None
        if n is None:
            n = common_prefix(self.tokens, tokens)
            self.truncate(n)
        else:
            self.tokens = list(tokens[:n])
        return n

    def drop(self, start: int, n: int) -> bool:
        """Remove cells [start, start + n) and move the later ones down (Context.drop)."""
        return drop_cells(self.shared._mem, self.seq_id, self.tokens, start, n, self.shared.can_rollback)

    def memory(self) -> MemoryUse:
        """This sequence's share of the context's buffers."""
        s = self.shared
        return MemoryUse(weights=s.model.weights_bytes, kv_cache=s.kv_bytes // s.n_seq,
                         compute=s.compute_bytes // s.n_seq)

    def close(self) -> None:
        """The shared context is freed when its last sequence is closed."""
        if not self._closed:
            self._closed = True
            self.shared._release()
