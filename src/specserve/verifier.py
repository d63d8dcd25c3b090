"""Verification of a draft against the target: a pure function, no model calls.

Greedy: accept while the draft token is the target's argmax, then emit the target's
argmax (the *recovered* token at the first mismatch, or the *bonus* token after a
fully accepted draft).

Sampling (Leviathan et al. 2023; Chen et al. 2023): accept draft token x with
probability min(1, p(x) / q(x)); on the first rejection sample the recovered token
from normalize(max(0, p - q)); if all are accepted sample a bonus token from p.
A deterministic drafter (probs None) has q = one-hot(x): accept with probability
p(x), recover from p with x removed.

method="exact" is llama.cpp's rule, kept for comparison: sample from p at each
position and accept while the sample equals the draft token. Also lossless, but it
accepts only with probability p(x) instead of min(1, p(x)/q(x)).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .config import SamplingParams
from .sampling import process, sample


@dataclass(frozen=True)
class Verdict:
    n_accepted: int  # how many draft tokens were kept
    tokens: list[int]  # the accepted draft tokens followed by one recovered or bonus token


def verify(
    draft_tokens: Sequence[int],
    draft_probs: np.ndarray | None,  # [k, n_vocab] q for each draft token, or None (deterministic)
    target_logits: np.ndarray,  # [k + 1, n_vocab] raw target logits, row i predicts position i
    params: SamplingParams,
    rng: np.random.Generator,
    method: str = "rejection",
) -> Verdict:
    k = len(draft_tokens)
    assert target_logits.shape[0] >= k + 1, "the target must score every draft position plus the bonus"
    if params.greedy:
        return verify_greedy(draft_tokens, np.argmax(target_logits[: k + 1], axis=-1))
    if method == "exact":
        return _verify_exact(draft_tokens, target_logits, params, rng)
    for i, x in enumerate(draft_tokens):
        p = process(target_logits[i], params)
        if draft_probs is None:
            q_x = 1.0
        else:
            q_x = float(draft_probs[i, x])
        if q_x > 0 and rng.random() * q_x < p[x]:  # u < p(x) / q(x)
            continue
        if draft_probs is None:
            residual = p.copy()
            residual[x] = 0.0
        else:
            residual = np.maximum(p - draft_probs[i], 0.0)
        if residual.sum() <= 0:  # p == q up to rounding: any draw from p is exact
            residual = p
        return Verdict(i, [*draft_tokens[:i], sample(residual, rng)])
    bonus = sample(process(target_logits[k], params), rng)
    return Verdict(k, [*draft_tokens, bonus])


def verify_greedy(draft_tokens: Sequence[int], target_argmax: np.ndarray) -> Verdict:
    """target_argmax: [k + 1] the target's argmax token at each draft position plus the bonus."""
    for i, x in enumerate(draft_tokens):
        if int(target_argmax[i]) != x:
            return Verdict(i, [*draft_tokens[:i], int(target_argmax[i])])
    k = len(draft_tokens)
    return Verdict(k, [*draft_tokens, int(target_argmax[k])])


def _verify_exact(draft_tokens, target_logits, params, rng) -> Verdict:
    for i, x in enumerate(draft_tokens):
        t = sample(process(target_logits[i], params), rng)
        if t != x:
            return Verdict(i, [*draft_tokens[:i], t])
    k = len(draft_tokens)
    return Verdict(k, [*draft_tokens, sample(process(target_logits[k], params), rng)])
