"""llama.cpp through llama-cpp-python's low-level API.

Logits are asked for only at the positions being verified (the batch API's
per-token `logits` flags); llama-cpp-python's n_ctx x n_vocab `scores` buffer is
never allocated. Logits come back as a numpy view of llama.cpp's own output
buffer, without a copy.

Speculation drops rejected tokens from the cache (`truncate`). An attention cache
can drop any suffix; sliding-window layers can too because their cache is allocated
full size (`swa_full`), so no cell inside the window is reused early. A recurrent or
hybrid memory keeps one state per sequence and cannot go back: there `truncate`
clears the sequence and evaluates the kept tokens again, and `can_rollback` is False
so that the engine does not speculate.

On CPUs with AMX, llama.cpp's AMX weight buffers (an "extra" buffer type it prefers
for quantized weights there) crash this build's matrix multiplication on any batch of
two or more tokens (SIGSEGV in ggml_backend_amx_mul_mat): extra buffer types are off
on such CPUs (see llama_native.use_extra_buffers) unless SPECSERVE_EXTRA_BUFFERS=1.
"""
from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from typing import Sequence

import numpy as np

import llama_cpp as C

from . import exact as exact_mod
from .base import MemoryUse, Model, VocabInfo, common_prefix
from .cache_reuse import drop_cells, reuse_chunks
from .llama_cpp_batch import SharedContext
from .llama_native import DecodeThreads, LoadLog, NativeContext, init_backend, mib_sum, use_extra_buffers

_VOCAB_TYPES = {0: "none", 1: "spm", 2: "bpe", 3: "wpm", 4: "ugm", 5: "rwkv", 6: "plamo2"}
_ATTR_CONTROL = 1 << 3  # llama_token_attr: LLAMA_TOKEN_ATTR_CONTROL


def _identity(path: str) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


class LlamaCppModel(Model):
    """A GGUF model loaded by llama.cpp: weights and vocabulary, shared by its contexts."""

    def __init__(self, path: str, n_gpu_layers: int = 0, n_threads: int | None = None, vocab_only: bool = False,
                 exact: bool = False):
        """vocab_only: read the vocabulary and metadata, no weights (draft_choice.py pairs candidates so,
        in about 0.6 s for a 152k vocabulary); such a model tokenizes but has no contexts.
        exact: passes of any size compute each token's logits as a one-token pass does (backends/exact.py):
        checked on the loaded model, `exact_check` says what was found."""
        if not os.path.isfile(path):
            raise FileNotFoundError(f"model file not found: {path}")
        init_backend()
        self.path = path
        self.exact, self.pad_single, self.exact_check = exact, False, None
        if exact:
            late = exact_mod.prepare_process(bool(DecodeThreads.live()))
            if late:
                logging.getLogger("specserve").warning("--exact: %s", late)
        self.n_gpu_layers = n_gpu_layers
        self.n_threads = n_threads or max(1, os.cpu_count() or 1)
        self.vocab_only = vocab_only
        self._open()
        model = self.handle
        self.n_ctx_train = C.llama_model_n_ctx_train(model)
        self.weights_bytes = mib_sum(r"model buffer size", self.load_log) or C.llama_model_size(model)
        # the CPU backend's repacked copy of some matrices (part of weights_bytes)
        self.repacked_bytes = mib_sum(r"(?:CPU_REPACK|AMX) model buffer size", self.load_log)
        self.metadata = self._read_metadata()
        self.vocab = self._read_vocab()
        self.can_rollback = not any(bool(getattr(C, f, lambda m: False)(model))
                                    for f in ("llama_model_is_recurrent", "llama_model_is_hybrid"))
        self._piece_cache: dict[int, bytes] = {}
        self._llg_tokenizer = None
        self._llg_lock = threading.Lock()
        if exact:
            self.exact_check = exact_mod.check(self)
            self.pad_single = self.exact_check.pad_single

    def _open(self) -> None:
        params = C.llama_model_default_params()
        params.n_gpu_layers = self.n_gpu_layers
        params.use_extra_bufts = use_extra_buffers() and not self.exact  # repacked weights switch kernel at 4 rows
        params.vocab_only = self.vocab_only
        model, self.load_log = LoadLog.capture(lambda: C.llama_model_load_from_file(self.path.encode(), params))
        if not model:
            raise ValueError(f"llama.cpp could not load {self.path} (not a GGUF model it supports?)")
        self.handle = model  # llama.cpp's model pointer: contexts are created from it (llama_native)
        self._vocab = C.llama_model_get_vocab(model)
        self._file = _identity(self.path)

    def unload(self) -> None:
        """Free the weights and llama.cpp's vocabulary (a sleeping server: server/core/sleep.py), keeping what
        was read from them: path, metadata (with what the command line put there), vocab, token pieces. Its
        contexts must be closed first. Until `reload`, anything that needs llama.cpp raises RuntimeError."""
        self._llg_tokenizer = None  # llguidance's tokenizer calls into the freed vocabulary
        self.close()
        self._vocab = None

    def reload(self) -> None:
        """Load the weights again from the same file with the same settings (after `unload`)."""
        if self.handle:
            return
        if _identity(self.path) != self._file:  # what was read from the old file (vocab, metadata) is kept
            raise ValueError(f"{self.path} changed on disk since it was loaded: restart the server to serve it")
        self._open()

    def _native_vocab(self):
        if self._vocab is None:
            raise RuntimeError(f"{self.path} is unloaded (the server is asleep)")
        return self._vocab

    # --- vocabulary -------------------------------------------------------------------------

    def _read_metadata(self) -> dict[str, str]:
        out = {}
        buf = ctypes.create_string_buffer(1 << 16)
        for i in range(C.llama_model_meta_count(self.handle)):
            C.llama_model_meta_key_by_index(self.handle, i, buf, len(buf))
            key = buf.value.decode("utf-8", errors="replace")
            n = C.llama_model_meta_val_str_by_index(self.handle, i, buf, len(buf))
            if n >= len(buf):  # long values (chat templates): ask again with room for all of it
                big = ctypes.create_string_buffer(n + 1)
                C.llama_model_meta_val_str_by_index(self.handle, i, big, len(big))
                out[key] = big.value.decode("utf-8", errors="replace")
            else:
                out[key] = buf.value.decode("utf-8", errors="replace")
        return out

    def _read_vocab(self) -> VocabInfo:
        v = self._vocab
        n = C.llama_vocab_n_tokens(v)
        texts = [(C.llama_vocab_get_text(v, i) or b"").decode("utf-8", errors="replace") for i in range(n)]
        attrs = [int(C.llama_vocab_get_attr(v, i)) for i in range(n)]
        eog = frozenset(i for i in range(n) if C.llama_vocab_is_eog(v, i))
        bos, eos = C.llama_vocab_bos(v), C.llama_vocab_eos(v)
        return VocabInfo(
            vocab_type=_VOCAB_TYPES.get(C.llama_vocab_type(v), "unknown"),
            n_vocab=n,
            bos=bos if bos >= 0 else None,
            eos=eos if eos >= 0 else None,
            eog=eog,
            add_bos=bool(C.llama_vocab_get_add_bos(v)),
            add_eos=bool(C.llama_vocab_get_add_eos(v)),
            token_texts=texts,
            token_attrs=attrs,
        )

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        vocab = self._native_vocab()
        data = text.encode("utf-8")
        cap = len(data) + 8
        buf = (C.llama_token * cap)()
        n = C.llama_tokenize(vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (C.llama_token * cap)()
            n = C.llama_tokenize(vocab, data, len(data), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def token_bytes(self, token: int, special: bool = False) -> bytes:
        key = token if not special else ~token
        piece = self._piece_cache.get(key)
        if piece is None:
            vocab = self._native_vocab()
            buf = ctypes.create_string_buffer(64)
            n = C.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = C.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
            piece = buf.raw[:n]
            self._piece_cache[key] = piece
        return piece

    def detokenize(self, tokens: Sequence[int], special: bool = False) -> bytes:
        return b"".join(self.token_bytes(t, special) for t in tokens)

    def grammar_tokenizer(self):
        """llguidance's tokenizer for this vocabulary (grammar-constrained generation), built on
        first use (~0.2 s for 49k tokens) and kept. Every end-of-generation token ends a grammar;
        added tokens spelled like tags are text where a grammar forces their text (llg_vocab.py)."""
        with self._llg_lock:  # the server builds it beside the first requests (server/app.py warm)
            if self._llg_tokenizer is None:
                from .llg_vocab import grammar_tokenizer

                self._llg_tokenizer = grammar_tokenizer(self, self._native_vocab())
            return self._llg_tokenizer

    def is_control(self, token: int) -> bool:
        return bool(self.vocab.token_attrs[token] & _ATTR_CONTROL)

    # --- contexts -----------------------------------------------------------------------------

    def new_context(self, n_ctx: int, n_batch: int = 512, n_ubatch: int | None = None,
                    pad_single: bool | None = None) -> "LlamaCppContext":
        """n_ubatch: llama.cpp's micro-batch (default n_batch), which sizes the compute buffer; pad_single: see
        NativeContext._open_native (the exact check compares with and without)."""
        self._native_vocab()
        return LlamaCppContext(self, n_ctx, n_batch, n_ubatch, pad_single)

    def new_shared_context(self, n_ctx: int, n_seq: int, n_batch: int = 512, n_ubatch: int | None = None):
        """n_seq sequences of n_ctx tokens in one context, decoded together (llama_cpp_batch)."""
        self._native_vocab()
        return SharedContext(self, n_ctx, n_seq, n_batch, n_ubatch)

    def close(self) -> None:
        if self.handle:
            C.llama_model_free(self.handle)
            self.handle = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class LlamaCppContext(NativeContext):
    """One sequence's KV cache (sequence id 0) on a LlamaCppModel."""

    shared = None  # a context of its own: its passes run alone (Context.shared)

    def __init__(self, model: LlamaCppModel, n_ctx: int, n_batch: int = 512, n_ubatch: int | None = None,
                 pad_single: bool | None = None):
        self.model = model
        self.n_ctx = n_ctx
        self.n_batch = min(n_batch, n_ctx)
        self.n_vocab = model.vocab.n_vocab
        self._open_native(model, n_ctx, self.n_batch, 1, f"{n_ctx} tokens", n_ubatch, pad_single=pad_single)
        self._tokens: list[int] = []
        self.t_eval = 0.0

    @property
    def tokens(self) -> list[int]:
        return self._tokens

    def eval(self, tokens: Sequence[int], logits: str = "last") -> np.ndarray:
        n = len(tokens)
        if n == 0:
            raise ValueError("eval needs at least one token")
        start = len(self._tokens)
        if start + n > self.n_ctx:
            raise ValueError(f"context full: {start} + {n} tokens > n_ctx {self.n_ctx}")
        all_logits = logits == "all"
        if all_logits and n > self.n_batch:
            raise ValueError(f"cannot return logits for {n} tokens in one pass (n_batch {self.n_batch})")
        b = self._batch
        for chunk_start in range(0, n, self.n_batch):
            chunk = tokens[chunk_start : chunk_start + self.n_batch]
            last_chunk = chunk_start + len(chunk) == n
            for i, t in enumerate(chunk):
                b.token[i] = t
                b.pos[i] = start + chunk_start + i
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = 0
                b.logits[i] = all_logits or (last_chunk and i == len(chunk) - 1)
            b.n_tokens = len(chunk)
            DecodeThreads.note()
            t0 = time.perf_counter()
            rc = self._decode(b)
            self.t_eval += time.perf_counter() - t0
            if rc != 0:
                self.truncate(start + chunk_start)
                raise RuntimeError(f"llama_decode failed with status {rc}")
            self._tokens.extend(chunk)
        n_out = n if all_logits else 1
        return self._logits(n_out)

    def truncate(self, n: int) -> None:
        if n >= len(self._tokens):
            return
        if C.llama_memory_seq_rm(self._mem, 0, n, -1):
            del self._tokens[n:]
            return
        # The memory cannot drop a suffix (a recurrent state): start over and evaluate what is kept.
        keep = self._tokens[:n]
        if not C.llama_memory_seq_rm(self._mem, 0, -1, -1):
            raise RuntimeError(f"llama.cpp could not clear the cache of {self.model.path}")
        self._tokens = []
        if keep:
            self.eval(keep, logits="last")

    def reuse(self, tokens: Sequence[int], n_min: int) -> int:
        """Keep what of the cache `tokens` can use: its common prefix and, with n_min > 0, runs of >= n_min
        cached tokens that moved to earlier positions in `tokens` (cache_reuse). The cache then holds
        tokens[:n]; return n."""
        n = reuse_chunks(self._mem, 0, self._tokens, tokens, n_min) if n_min > 0 and self.model.can_rollback else None
        if n is None:
            n = common_prefix(self._tokens, tokens)
            self.truncate(n)
        else:
            self._tokens = list(tokens[:n])
        return n

    def drop(self, start: int, n: int) -> bool:
        """Remove cells [start, start + n) and move the later ones down (Context.drop)."""
        return drop_cells(self._mem, 0, self._tokens, start, n, self.model.can_rollback)

    def memory(self) -> MemoryUse:
        return MemoryUse(weights=self.model.weights_bytes, kv_cache=self.kv_bytes, compute=self.compute_bytes)

