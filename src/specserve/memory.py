"""Memory: what the models and their caches take, estimated from GGUF metadata and measured.

The estimate needs only the GGUF header, so it can answer "does this pair fit?" before
anything is loaded. Three parts per model, each what llama.cpp allocates on the CPU:

- weights: the sum of the tensors' bytes (the file, memory-mapped), plus the CPU
  backend's repacked copy: where llama.cpp may use its "extra" buffers (see
  backends.llama_native.use_extra_buffers; not on AMX CPUs), it copies the matrix weights
  of types it has interleaved kernels for (on x86: Q4_0, Q4_K, IQ4_NL; rows a multiple
  of 8; never the token embedding, which is only gathered from) into a CPU_REPACK
  buffer of the same size, for faster batched matmuls. Measured with llama-cpp-python
  0.3.36 on AVX-512 (AMX masked): Qwen2.5-Coder-1.5B Q4_K_M 1059.9 MiB mapped + 596.5
  MiB repacked (its Q4_K matrices; Q6_K stays), the 0.5B mix + 28.1 MiB (its Q4_K;
  Q5_0/Q8_0 stay), Gemma 3 270M + 12.7 MiB, SmolLM2 Q4_1 and F16 files nothing.
- KV cache: n_layer * n_head_kv * (head_dim_k + head_dim_v) * bytes per element
  (F16: 2) per cell; llama.cpp rounds the number of cells up to a multiple of 256.
  Sliding-window layers are counted at full size, as llama.cpp's default
  (`swa_full`) allocates them. A draft model with a window (--draft-ctx N,
  drafters/window.py) has N cells, whatever the context (`cells`).
- compute buffer: llama.cpp sizes it for the worst graph, one micro-batch of
  n_ub = min(n_ubatch, n_ctx) tokens with every position producing logits (n_ubatch:
  -ub for the target, -ubd for the draft, config.UBATCH_DEFAULT and UBATCH_DRAFT_DEFAULT),
  and reuses memory between stages, so the buffer is the largest stage (float32
  activations, flash attention off):
      4 * n_ub * max(n_kv * (n_head + 1) + 7 * n_embd,   # attention: KQ scores per head, the mask
                     3 * n_ff + n_kv + 4 * n_embd,       # feed-forward: gate, up, product; mask alive
                     n_vocab + 2 * n_embd)               # output: logits for every position
  with n_kv the padded cell count. Fitted on SmolLM2-135M (F16 and Q4_1), Gemma 3
  270M and tiny llama models of varied shapes at 64-8192 tokens: within 1.5% of
  what llama.cpp reports; at micro-batches of 16 to 512 tokens on the reference pair
  too (tests/test_memory.py, tests/cli/test_check.py).
"""
from __future__ import annotations

import ctypes
import os
import re
from dataclasses import asdict, dataclass

KV_CELL_PADDING = 256  # llama.cpp pads the KV cache to a multiple of this many cells
MAX_UBATCH = 512  # the most tokens a pass of our llama.cpp contexts takes (their n_batch): the largest micro-batch
REPACKED_TYPES = frozenset({"Q4_0", "Q4_K", "IQ4_NL"})  # what llama.cpp's CPU_REPACK interleaves on x86
# Bytes per element of the KV cache types llama.cpp offers (block types: bytes per block / 32).
KV_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q5_1": 24 / 32, "q5_0": 22 / 32,
                 "q4_1": 20 / 32, "q4_0": 18 / 32, "iq4_nl": 18 / 32}
_UNITS = {"": 1, "b": 1, "k": 1024, "kib": 1024, "kb": 1000, "m": 1024**2, "mib": 1024**2, "mb": 1000**2,
          "g": 1024**3, "gib": 1024**3, "gb": 1000**3, "t": 1024**4, "tib": 1024**4, "tb": 1000**4}


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def parse_bytes(text: str) -> int:
    """'24GiB', '24G' (binary), '24GB' (decimal), '512 MiB', '1e9' -> bytes. ValueError otherwise."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*", str(text).lower())
    if not m or m.group(2) not in _UNITS:
        raise ValueError(f"cannot read {text!r} as a size; write e.g. 24GiB, 512MiB or 8GB")
    n = int(float(m.group(1)) * _UNITS[m.group(2)])
    if n <= 0:
        raise ValueError(f"a memory budget must be positive, got {text!r}")
    return n


def kv_cells(n_ctx: int) -> int:
    """Cells llama.cpp allocates for a context of n_ctx tokens."""
    return -(-n_ctx // KV_CELL_PADDING) * KV_CELL_PADDING


@dataclass(frozen=True)
class ModelShape:
    """The facts of a GGUF model that decide its memory use."""

    path: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    weights_bytes: int
    repack_bytes: int = 0  # of weights_bytes, what the CPU backend copies into its repack buffer

    @classmethod
    def from_gguf(cls, path: str | os.PathLike) -> "ModelShape":
        from .gguf_meta import read_header, read_metadata, summary

        s = summary(path)
        missing = [k for k in ("n_layer", "n_embd", "n_head", "n_head_kv", "head_dim_k", "head_dim_v",
                               "vocab_size") if getattr(s, k) is None]
        if missing:
            raise ValueError(f"{path}: GGUF metadata lacks {', '.join(missing)}; cannot estimate memory")
        n_ff = read_metadata(path).get(f"{s.architecture}.feed_forward_length", 0)
        n_ff = max(n_ff) if isinstance(n_ff, list) else int(n_ff or 0)
        repack = sum(t.n_bytes for t in read_header(path).tensors
                     if t.ggml_type in REPACKED_TYPES and len(t.shape) == 2 and t.shape[1] % 8 == 0
                     and not t.name.startswith("token_embd"))
        return cls(os.fspath(path), s.n_layer, s.n_embd, s.n_head, s.n_head_kv, s.head_dim_k, s.head_dim_v,
                   n_ff, s.vocab_size, s.context_length or 0, s.tensor_bytes, repack)

    def kv_bytes_per_token(self, cache_type: str = "f16") -> int:
        per_element = KV_TYPE_BYTES[cache_type]
        return int(self.n_layer * self.n_head_kv * (self.head_dim_k + self.head_dim_v) * per_element)

    def compute_bytes(self, n_ctx: int, n_ubatch: int = MAX_UBATCH) -> int:
        """llama.cpp's compute buffer for one context whose micro-batch is n_ubatch tokens (module docstring)."""
        n_ub, n_kv = min(n_ubatch, MAX_UBATCH, n_ctx), kv_cells(n_ctx)
        attention = n_kv * (self.n_head + 1) + 7 * self.n_embd
        feed_forward = 3 * self.n_ff + n_kv + 4 * self.n_embd
        output = self.n_vocab + 2 * self.n_embd
        return 4 * n_ub * max(attention, feed_forward, output)


@dataclass(frozen=True)
class MemoryEstimate:
    """One model with one context of n_ctx tokens, in bytes."""

    n_ctx: int
    weights: int  # the file's tensors plus the repacked copy
    kv_per_token: int
    kv: int
    compute: int
    repacked: int = 0  # of weights: the CPU backend's repacked copy of some matrices
    n_ubatch: int = MAX_UBATCH  # the tokens a pass computes at once, which size `compute`

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute

    def as_dict(self) -> dict:
        return {**asdict(self), "total": self.total}


def estimate(shape: ModelShape, n_ctx: int, cache_type: str = "f16", repack: bool | None = None,
             n_ubatch: int = MAX_UBATCH) -> MemoryEstimate:
    """Memory of `shape` loaded with one context of n_ctx tokens, computing n_ubatch tokens at once.

    repack: whether llama.cpp will keep a repacked copy of some weights (default: what
    our backend decides on this machine).
    """
    if n_ctx <= 0:
        raise ValueError(f"context size must be > 0, got {n_ctx}")
    if repack is None:
        from .backends.llama_native import use_extra_buffers

        repack = use_extra_buffers()
    per_token = shape.kv_bytes_per_token(cache_type)
    repacked = shape.repack_bytes if repack else 0
    return MemoryEstimate(n_ctx, shape.weights_bytes + repacked, per_token, per_token * kv_cells(n_ctx),
                          shape.compute_bytes(n_ctx, n_ubatch), repacked, min(n_ubatch, MAX_UBATCH, n_ctx))


def max_ctx_in_budget(shapes: list[ModelShape], budget: int, limit: int, cache_type: str = "f16",
                      windows: list[int] | None = None, ubatches: list[int] | None = None) -> int:
    """The largest context (a multiple of 256, at most `limit`) at which all `shapes` fit in `budget`; 0 if none.
    windows: per shape, the cells its cache holds at most (a draft's --draft-ctx), 0: the context's.
    ubatches: per shape, its micro-batch (-ub, -ubd; default MAX_UBATCH)."""
    windows = windows or [0] * len(shapes)
    ubatches = ubatches or [MAX_UBATCH] * len(shapes)

    def fits(n_ctx: int) -> bool:
        return sum(estimate(s, cells(n_ctx, w), cache_type, n_ubatch=u).total
                   for s, w, u in zip(shapes, windows, ubatches)) <= budget

    lo, hi = 0, limit // KV_CELL_PADDING  # in units of 256 cells; total grows with the context
    if hi and fits(hi * KV_CELL_PADDING):
        return hi * KV_CELL_PADDING
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid * KV_CELL_PADDING) else (lo, mid)
    return lo * KV_CELL_PADDING


def cells(n_ctx: int, window: int) -> int:
    """The tokens a draft model's cache holds in a context of n_ctx with --draft-ctx `window` (0: all)."""
    return window if 0 < window < n_ctx else n_ctx


def measure(model, n_ctx: int, n_ubatch: int = MAX_UBATCH) -> MemoryEstimate:
    """What llama.cpp reports allocating for a loaded model and a fresh context of n_ctx tokens that
    computes n_ubatch tokens at once."""
    ctx = model.new_context(n_ctx, n_ubatch=n_ubatch)
    try:
        use = ctx.memory()
    finally:
        ctx.close()
    return MemoryEstimate(n_ctx, use.weights, use.kv_cache // kv_cells(n_ctx), use.kv_cache, use.compute,
                          getattr(model, "repacked_bytes", 0), min(n_ubatch, MAX_UBATCH, n_ctx))


def relative_error(estimated: float, measured: float) -> float | None:
    return (estimated - measured) / measured if measured else None


def physical_memory() -> int | None:
    """This machine's RAM in bytes, where the OS says."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def summary_line(role: str, name: str, est: MemoryEstimate) -> str:
    """One model's memory on one line: weights, KV per token and at the context, compute (for passes of
    how many tokens at once), total."""
    return (f"{role} {name}: weights {fmt_bytes(est.weights)}, KV {fmt_bytes(est.kv_per_token)}/token "
            f"x {kv_cells(est.n_ctx)} = {fmt_bytes(est.kv)}, compute {fmt_bytes(est.compute)} "
            f"({est.n_ubatch} tokens at once), total {fmt_bytes(est.total)}")


def loaded_summary(engine) -> str:
    """The loaded models' memory at the engine's context, one line each, then the total.

    Weights are what llama.cpp reported loading; KV cache and compute buffer are
    estimated per slot (one context per model) from the GGUF metadata.
    """
    lines, total = [], 0
    for role, model in (("target", engine.target), ("draft", engine.draft)):
        if model is None:
            continue
        n_ctx = cells(engine.n_ctx, getattr(engine, "draft_window", 0)) if role == "draft" else engine.n_ctx
        n_ubatch = getattr(engine, "n_ubatch_draft" if role == "draft" else "n_ubatch", MAX_UBATCH)
        try:
            shape = ModelShape.from_gguf(model.path)
            est = estimate(shape, n_ctx, n_ubatch=n_ubatch)
        except (OSError, ValueError):
            lines.append(f"memory: {role} {os.path.basename(model.path)}: weights {fmt_bytes(model.weights_bytes)}")
            total += model.weights_bytes
            continue
        est = MemoryEstimate(est.n_ctx, model.weights_bytes, est.kv_per_token, est.kv, est.compute,
                             getattr(model, "repacked_bytes", 0), est.n_ubatch)
        line = "memory: " + summary_line(role, os.path.basename(model.path), est)
        if n_ctx < engine.n_ctx:  # --draft-ctx: what its window saves
            line += (f" (its window, --draft-ctx {n_ctx}: the first and the latest tokens; the whole context "
                     f"would take {fmt_bytes(estimate(shape, engine.n_ctx, n_ubatch=n_ubatch).total)})")
        lines.append(line)
        total += est.total
    lines.append(f"memory: total {fmt_bytes(total)} at context {engine.n_ctx} (one slot)")
    return "\n".join(lines)


def rss_bytes() -> int:
    """This process's resident set size, from /proc (0 where there is none)."""
    try:
        with open(f"/proc/{os.getpid()}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def trim_heap() -> None:
    """Give the heap's free memory back to the system (glibc's malloc_trim; nothing elsewhere): freed
    buffers below glibc's mmap threshold otherwise stay in the process for reuse."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass
