"""Logits -> the processed distribution a request samples from.

Order: temperature, then top-k, top-p and min-p on the tempered distribution (as
vLLM does). The target's p and the draft's q go through this same function, which
is what makes rejection sampling lossless for processed distributions.
"""
from __future__ import annotations

import numpy as np

from .config import SamplingParams

_TOP_P_CANDIDATES = 1024  # sort only this many first; fall back to a full sort if they miss top_p


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax of a 1-D float array, in float64."""
    z = x.astype(np.float64) - np.max(x)
    e = np.exp(z)
    return e / e.sum()


def process(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Return the processed distribution, float64 [n_vocab], for one row of logits.

    Greedy requests (temperature 0) get a one-hot at the argmax.
    """
    n_vocab = logits.shape[-1]
    if params.greedy:
        probs = np.zeros(n_vocab)
        probs[int(np.argmax(logits))] = 1.0
        return probs
    probs = softmax(logits / params.temperature)
    if params.top_k and params.top_k < n_vocab:
        keep = np.argpartition(-probs, params.top_k - 1)[: params.top_k]
        masked = np.zeros_like(probs)
        masked[keep] = probs[keep]
        probs = masked / masked.sum()
    if params.top_p < 1.0:
        probs = _top_p(probs, params.top_p)
    if params.min_p > 0.0:
        probs = np.where(probs >= params.min_p * probs.max(), probs, 0.0)
        probs /= probs.sum()
    return probs


def _top_p(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Keep the smallest set of most likely tokens whose mass reaches top_p."""
    n = probs.shape[0]
    cand = np.argpartition(-probs, _TOP_P_CANDIDATES - 1)[:_TOP_P_CANDIDATES] if n > _TOP_P_CANDIDATES else np.arange(n)
    order = cand[np.argsort(-probs[cand], kind="stable")]
    cum = np.cumsum(probs[order])
    if cum[-1] < top_p and len(order) < n:  # the candidates miss top_p: sort everything
        order = np.argsort(-probs, kind="stable")
        cum = np.cumsum(probs[order])
    n_keep = int(np.searchsorted(cum, top_p - 1e-9)) + 1  # first index where the mass reaches top_p
    keep = order[:n_keep]
    out = np.zeros_like(probs)
    out[keep] = probs[keep]
    return out / out.sum()


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token id from a (possibly unnormalised) non-negative vector."""
    cum = np.cumsum(probs)
    idx = int(np.searchsorted(cum, rng.random() * cum[-1], side="right"))
    return min(idx, probs.shape[0] - 1)


def select(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """Pick the next token from raw logits: argmax when greedy, else a draw from process()."""
    if params.greedy:
        return int(np.argmax(logits))
    return sample(process(logits, params), rng)
