"""Verification passes that round as plain steps do (`--exact`).

A greedy speculative run is the target alone's text only if a pass over k tokens computes each token's logits
bit for bit as k one-token passes would. llama.cpp's CPU backend (as llama-cpp-python 0.3.36 builds it) does
not: it picks kernels by the pass's size, and each kernel sums in its own order. Found op by op
(docs/exactness.md):

- attention without flash attention: KQ is a matrix product whose kernel changes from one query row to two;
  with flash attention each query row is computed alone, up to 63 rows; from 64 (`GGML_FA_TILE_Q`) rows a
  tiled kernel takes over;
- K-quant weights (Q2_K..Q6_K, IQ*): a tiled matmul from 8 rows (`ggml_tiled_min_batch`), vec_dot below;
  `GGML_CPU_TILED_MM=0` keeps vec_dot at every size (read once, at the first such product in the process);
- the CPU "extra" buffers (repacked Q4_0/Q4_K/IQ4_NL): a GEMV below 4 rows, a GEMM from 4;
- F16/BF16 weights: one kernel for one row, another (llamafile's tinyBLAS) from two; every size from 2 to 63
  agrees. A pass of one token gets a second, throwaway token in a sequence of its own (masked out for the
  real one, dropped after the pass), so it runs the kernel every other pass runs.

So an exact model's contexts use flash attention, micro-batches of at most 63 tokens (a longer pass is split,
and every split rounds alike), no extra buffers, and `GGML_CPU_TILED_MM=0`; whether one-token passes need the
throwaway token is measured on the loaded model at start (`check`), which also proves the rest on this build,
whatever its backend: a build that still differs is reported, never assumed exact.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

EXACT_UBATCH = 63  # flash attention computes each query row alone below GGML_FA_TILE_Q = 64 rows
TILED_ENV = "GGML_CPU_TILED_MM"


def prepare_process(passes_ran: bool) -> str | None:
    """Keep K-quant products on one kernel at every pass size in this process. llama.cpp reads the switch once,
    at the first K-quant product, so this runs before any model computes (passes_ran: some did). Returns why it
    may be too late, or None."""
    os.environ.setdefault(TILED_ENV, "0")
    if passes_ran:
        return (f"passes ran in this process before exact mode was chosen: llama.cpp may have read {TILED_ENV} "
                "already (the start-up check says whether it holds)")
    return None


@dataclass(frozen=True)
class ExactCheck:
    """What the start-up check found on the loaded model: `exact` whether passes of 1, 2, 12 and 64 tokens gave
    the logits of one-token steps bit for bit (with `pad_single`: one-token passes padded to two), and the
    largest difference seen before padding."""

    exact: bool
    pad_single: bool
    max_diff: float
    detail: str


def _probe_tokens(model, n: int) -> list[int]:
    """n ordinary tokens spread over the vocabulary (no control tokens), the same every time."""
    v = model.vocab
    picks, step = [], max(1, v.n_vocab // (n * 3 + 1))
    for t in range(step, v.n_vocab, step):
        if t not in v.eog and t != v.bos and not model.is_control(t) and model.detokenize([t]).strip():
            picks.append(t)
        if len(picks) == n:
            break
    return picks


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max())


def check(model) -> ExactCheck:
    """Compare, on a small context of the loaded model, one-token steps against passes of 2, 12 and 64 tokens
    (64: split into micro-batches of 63 and 1). About 30 passes of the model."""
    tokens = _probe_tokens(model, 4 + 64)
    prefix, seq = tokens[:4], tokens[4:]

    def run(ctx, chunks):
        ctx.truncate(0)
        ctx.eval(prefix)
        return np.concatenate([np.array(ctx.eval(c, logits="all")) for c in chunks])

    def compare(ctx) -> tuple[float, float]:
        steps = run(ctx, [[t] for t in seq[:12]])
        whole = run(ctx, [seq[:12]])
        pairs = run(ctx, [seq[:12][i:i + 2] for i in range(0, 12, 2)])
        return _max_diff(steps, whole), _max_diff(pairs, whole)

    ctx = model.new_context(128, n_batch=128, pad_single=False)
    try:
        single, paired = compare(ctx)
    finally:
        ctx.close()
    if single > 0 and paired > 0:
        return ExactCheck(False, False, single, f"passes of 2 and 12 tokens differ by up to {paired:.3g} in a logit "
                                                "on this build: no kernel choice made them agree")
    pad = single > 0
    ctx = model.new_context(128, n_batch=128, pad_single=pad)
    try:
        again, _ = compare(ctx)
        split = _max_diff(run(ctx, [seq[:12], seq[12:]]), run(ctx, [seq]))  # 64 tokens: micro-batches of 63 and 1
    finally:
        ctx.close()
    worst = max(again, split)
    if worst > 0:
        return ExactCheck(False, pad, single, f"passes still differ by up to {worst:.3g} in a logit on this build")
    how = "one-token passes padded to two (F16-like weights)" if pad else "no padding needed"
    return ExactCheck(True, pad, single, f"passes of 1-64 tokens round alike ({how}; before: up to {single:.3g})")
