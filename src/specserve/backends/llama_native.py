"""llama.cpp itself, as both llama.cpp backends use it: the library initialised once, its log captured
while a model or context is created (the sizes it allocated are only in its log), the threads that run
passes, whether the CPU's "extra" weight buffers are safe, and a native context with its decode batch.

`llama_cpp.py` (the model, and one sequence a context) and `llama_cpp_batch.py` (many sequences in one
context) build on this module. The model creates either kind of context; neither this module nor
`llama_cpp_batch.py` imports `llama_cpp.py`: a context sees its model as a `NativeModel`.
"""
from __future__ import annotations

import ctypes
import logging
import os
import re
import threading
from typing import Protocol

import llama_cpp as C
import numpy as np

from .base import VocabInfo
from .exact import EXACT_UBATCH


class LoadLog:
    """Captures llama.cpp's log while a model or context is created.

    llama.cpp reports the sizes of what it allocated (model buffer, KV cache,
    compute buffer) only in its log; we read them from there. Outside captures,
    only errors go to stderr (everything with SPECSERVE_VERBOSE=1).
    """

    _lock = threading.Lock()
    _lines: list[str] | None = None
    verbose = bool(os.environ.get("SPECSERVE_VERBOSE"))

    @staticmethod
    @C.llama_log_callback
    def _callback(level, text, user_data):
        msg = text.decode("utf-8", errors="replace") if text else ""
        if LoadLog._lines is not None:
            LoadLog._lines.append(msg)
        if LoadLog.verbose or level == 4:  # GGML_LOG_LEVEL_ERROR
            os.write(2, msg.encode())

    @classmethod
    def install(cls) -> None:
        C.llama_log_set(cls._callback, ctypes.c_void_p(0))

    @classmethod
    def capture(cls, fn):
        with cls._lock:
            cls._lines = []
            try:
                result = fn()
                return result, "".join(cls._lines)
            finally:
                cls._lines = None


_BACKEND_READY = threading.Event()


class DecodeThreads:
    """The live threads that have run llama.cpp passes in this process.

    llama-cpp-python builds llama.cpp with OpenMP, and libgomp keeps a team of worker threads for
    each thread that runs a pass. Once the teams hold more threads than the machine has cores,
    libgomp (as far as we can tell) throttles its spin-wait at its barriers, one per op of a pass,
    and waits on a futex instead: every pass then runs ~1.5x slower (the 0.5B draft's 1-token pass
    on 2 cores: 23.5 ms from one thread, 35 ms once a second thread has run passes). So each process
    runs its passes on one thread (the server: its engine thread, see Engine.calibrate); a second
    one is logged, once."""

    _lock = threading.Lock()
    _seen: dict[int, threading.Thread] = {}
    _warned = False

    @classmethod
    def note(cls) -> None:
        """Called before every pass; costs a dict lookup unless this thread is new."""
        if threading.get_ident() not in cls._seen:
            cls._add(threading.current_thread())

    @classmethod
    def _add(cls, thread: threading.Thread) -> None:
        with cls._lock:
            cls._seen = {i: t for i, t in cls._seen.items() if t.is_alive()}
            cls._seen[thread.ident] = thread
            if len(cls._seen) > 1 and not cls._warned:
                cls._warned = True
                logging.getLogger("specserve").warning(
                    "llama.cpp passes run on %d threads of this process (%s): with OpenMP each pass then runs "
                    "~1.5x slower; run them all on one thread", len(cls._seen),
                    ", ".join(t.name for t in cls._seen.values()))

    @classmethod
    def forget(cls) -> None:
        """Start over: no thread seen, no warning given (as in a new process)."""
        with cls._lock:
            cls._seen, cls._warned = {}, False

    @classmethod
    def live(cls) -> list[str]:
        """The names of the live threads that have run passes."""
        with cls._lock:
            return [t.name for t in cls._seen.values() if t.is_alive()]


def init_backend() -> None:
    if not _BACKEND_READY.is_set():
        LoadLog.install()
        C.llama_backend_init()
        _BACKEND_READY.set()


def cpu_has_amx() -> bool:
    """Whether this CPU has Intel AMX tiles (Linux: /proc/cpuinfo flags)."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " amx_tile" in line for line in f)
    except OSError:
        return False


def use_extra_buffers() -> bool:
    """Whether llama.cpp may put weights in its CPU "extra" buffers (AMX, CPU_REPACK).

    Not on a CPU with AMX: llama.cpp's AMX matmul (as built by llama-cpp-python 0.3.36)
    crashes there with a segmentation fault on Q4_K/Q6_K drafts, and on F16 weights it makes
    9- to 33-token passes 1.5-1.8x slower, the passes speculation verifies with.
    SPECSERVE_EXTRA_BUFFERS=1/0 overrides.
    """
    env = os.environ.get("SPECSERVE_EXTRA_BUFFERS")
    return env != "0" if env else not cpu_has_amx()


def mib_sum(pattern: str, log: str) -> int:
    """Sum every 'NAME ... = X MiB' figure matching pattern in a llama.cpp log, in bytes."""
    return int(sum(float(m) for m in re.findall(pattern + r"[^\n]*?=\s*([0-9.]+) MiB", log)) * 1024 * 1024)


class NativeModel(Protocol):
    """What a context needs of the model that creates it (llama_cpp.LlamaCppModel): a Protocol, so that
    the contexts here and in llama_cpp_batch.py do not import the model's module, which imports them."""

    path: str
    handle: object  # llama.cpp's model pointer
    n_threads: int
    vocab: VocabInfo
    can_rollback: bool
    weights_bytes: int
    exact: bool  # --exact: passes of any size round as one-token passes (backends/exact.py)
    pad_single: bool  # with exact: one-token passes get a throwaway second token


class NativeContext:
    """A llama.cpp context with its decode batch: created, measured and freed the same way by the
    single-sequence context (llama_cpp.LlamaCppContext) and the shared one (llama_cpp_batch.SharedContext)."""

    def _open_native(self, model: NativeModel, n_ctx: int, n_batch: int, n_seq: int, what: str,
                     n_ubatch: int | None = None, pooling: int | None = None,
                     pad_single: bool | None = None) -> None:
        """n_batch: the most tokens one decode takes; n_ubatch (default n_batch): the most llama.cpp
        computes at once. A decode of more is split by llama.cpp into micro-batches of n_ubatch, and the
        compute buffer is sized for one of them, logits over the vocabulary for each of its tokens
        (memory.ModelShape.compute_bytes): a draft whose passes are a few tokens needs a small one.
        pooling: embeddings on, pooled so (llama.cpp's LLAMA_POOLING_TYPE_*; backends/embedding.py).
        An exact model's contexts (backends/exact.py) use flash attention and micro-batches of at most
        EXACT_UBATCH; with pad_single (default: the model's) a sequence of its own takes the throwaway token
        that makes a one-token micro-batch two."""
        exact = getattr(model, "exact", False) and pooling is None  # not an embedding context
        pad = exact and (model.pad_single if pad_single is None else pad_single)
        params = C.llama_context_default_params()
        params.n_ctx = n_ctx + pad
        params.n_batch = n_batch + pad
        n_ubatch = max(1, min(n_ubatch or n_batch, n_batch))
        self.n_ubatch = params.n_ubatch = min(n_ubatch, EXACT_UBATCH) if exact else n_ubatch
        params.n_seq_max = n_seq + pad
        params.kv_unified = n_seq + pad > 1  # the slots share one cache (llama.cpp would split it evenly)
        params.n_threads = params.n_threads_batch = model.n_threads
        # flash attention halves decode speed on some CPUs (docs/exactness.md), but computes each query row alone
        params.flash_attn_type = C.LLAMA_FLASH_ATTN_TYPE_ENABLED if exact else C.LLAMA_FLASH_ATTN_TYPE_DISABLED
        params.swa_full = True  # a sliding-window cache that reuses cells could not be rolled back
        params.no_perf = True
        if pooling is not None:
            params.embeddings, params.pooling_type = True, pooling
        ctx, self.load_log = LoadLog.capture(lambda: C.llama_init_from_model(model.handle, params))
        if not ctx:
            raise MemoryError(f"llama.cpp could not create a context of {what} for {model.path}")
        self._ctx = ctx
        self._mem = C.llama_get_memory(ctx)
        self._batch = C.llama_batch_init(n_batch + pad, 0, 1)
        self._pad_seq = n_seq if pad else None
        self.kv_bytes = mib_sum(r"KV buffer size", self.load_log)
        self.compute_bytes = mib_sum(r"compute buffer size", self.load_log)

    def _decode(self, b) -> int:
        """llama_decode; exact with pad_single, the throwaway token goes last where the last micro-batch would
        hold one token or ask logits of one: llama.cpp computes the output projection only over the rows that
        ask for logits, so one such row would take the one-row kernel too. It asks for logits (after the real
        rows, which callers read) and leaves no cell behind."""
        n = b.n_tokens
        if self._pad_seq is None or (n % self.n_ubatch != 1
                                     and sum(b.logits[i] != 0 for i in range(n - 1 - (n - 1) % self.n_ubatch, n)) != 1):
            return C.llama_decode(self._ctx, b)
        b.token[n] = b.token[n - 1]
        b.pos[n] = 0
        b.n_seq_id[n] = 1
        b.seq_id[n][0] = self._pad_seq
        b.logits[n] = True
        b.n_tokens = n + 1
        try:
            return C.llama_decode(self._ctx, b)
        finally:
            b.n_tokens = n
            C.llama_memory_seq_rm(self._mem, self._pad_seq, -1, -1)

    _view: tuple = (None, 0, None)  # (address, rows, array): the last logits view handed out

    def _logits(self, n_out: int):
        """[n_out, n_vocab] float32, a view of llama.cpp's logits of the last pass (valid until the next).
        The view is made again only when llama.cpp's buffer moved: making one costs a few microseconds,
        nine times a step."""
        ptr = C.llama_get_logits(self._ctx)
        address = ctypes.cast(ptr, ctypes.c_void_p).value
        if self._view[0] != address or self._view[1] != n_out:
            self._view = (address, n_out, np.ctypeslib.as_array(ptr, shape=(n_out, self.n_vocab)))
        return self._view[2]

    def close(self) -> None:
        if self._ctx:
            C.llama_batch_free(self._batch)
            C.llama_free(self._ctx)
            self._ctx = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
