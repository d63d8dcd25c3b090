"""The log-probability of each committed token and its most likely alternatives, from the verification pass.

They describe the target's distribution at each committed position, read from the rows the verification
pass already computed (nothing more is evaluated), so they are the target alone's whatever drafted the
token: speculation changes which pass scored a position, not what the target said there (up to the
batched kernels' rounding, a few 1e-3 in logits; tests/test_logprobs.py measures it).

Two distributions (SamplingParams.logprobs_mode):
- "raw" (the default): log_softmax of the model's logits, before logit_bias, penalties, grammar masks,
  temperature and truncation. That is what llama-server returns for `n_probs` (its default
  `post_sampling_probs: false` reads the logits through `get_token_probabilities`, a plain softmax)
  and vLLM's default `logprobs_mode` ("raw_logprobs", computed before any logits processor), so a
  client sees the same numbers from either. A token that logit_bias or a grammar forbids can then
  appear among the alternatives, and a forced token (a grammar's, /infill's healed bytes) gets the
  model's own opinion of it, however low.
- "processed": the distribution the token was drawn from (llama-server's `post_sampling_probs: true`,
  vLLM's "processed_logprobs"): after all of the above; greedy is one-hot at the argmax. Alternatives
  outside it (probability 0) are left out, so a row may list fewer than asked.
Alternatives come most likely first, equal values in id order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .sampling import Candidates
from .top_k import top_k_ids


@dataclass(frozen=True)
class TokenLogprob:
    id: int  # the committed token
    logprob: float  # its log-probability (natural log)
    top: tuple[tuple[int, float], ...] = ()  # (id, logprob) of the most likely tokens there, most likely first


def raw(logits: np.ndarray, tokens: Sequence[int], n_top: int) -> list[TokenLogprob]:
    """logits: [>= len(tokens), V], row i the target's raw logits at token i's position."""
    n = len(tokens)
    if n == 0:
        return []
    z = np.asarray(logits[:n], dtype=np.float32)  # [n, V]
    m = z.max(axis=1, keepdims=True)  # [n, 1]
    e = z - m
    np.exp(e, out=e)  # one vocabulary-sized scratch array, reused
    lse = m[:, 0].astype(np.float64) + np.log(e.sum(axis=1).astype(np.float64))  # [n]
    chosen = z[np.arange(n), np.asarray(tokens)] - lse
    top_ids = _top(z, n_top)  # [n, n_top]
    top_lp = np.take_along_axis(z, top_ids, axis=1) - lse[:, None]
    return [TokenLogprob(int(t), float(lp), tuple(zip(map(int, ids), map(float, lps))))
            for t, lp, ids, lps in zip(tokens, chosen, top_ids, top_lp)]


def processed(dist: Candidates | None, tokens: Sequence[int], n_top: int) -> list[TokenLogprob]:
    """dist: the rows' processed distributions ([>= len(tokens)] rows), None when greedy (one-hot)."""
    if dist is None:
        return [TokenLogprob(int(t), 0.0, ((int(t), 0.0),) if n_top else ()) for t in tokens]
    n = len(tokens)
    if n == 0:
        return []
    ids, p = dist.ids[:n], dist.probs[:n]  # [n, W]
    p_chosen = np.where(ids == np.asarray(tokens)[:, None], p, 0).sum(axis=1, dtype=np.float64)
    cols = _top(p, n_top)  # [n, n_top]; candidates are in id order, or sorted stably: lower columns, lower ids
    top_ids, top_p = np.take_along_axis(ids, cols, axis=1), np.take_along_axis(p, cols, axis=1).astype(np.float64)
    with np.errstate(divide="ignore"):
        return [TokenLogprob(int(t), float(np.log(pc)),
                             tuple((int(i), float(np.log(q))) for i, q in zip(r_ids, r_p) if q > 0))
                for t, pc, r_ids, r_p in zip(tokens, p_chosen, top_ids, top_p)]


def _top(values: np.ndarray, k: int) -> np.ndarray:
    """[R, k] column indices of each row's k largest values ([R, W]), largest first; equal values by
    column, lowest first (sampling.top_k_ids: no sort of the whole row)."""
    R, W = values.shape
    k = min(k, W)
    if k == 0:
        return np.zeros((R, 0), np.int64)
    cols = top_k_ids(values, k) if k < W else np.broadcast_to(np.arange(W), (R, W))  # [R, k] in column order
    return np.take_along_axis(cols, np.lexsort((cols, -np.take_along_axis(values, cols, axis=1)), axis=-1), axis=1)
