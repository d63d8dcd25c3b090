"""Verification of a draft against the target: a pure function, no model calls.

Row i of the target's logits is its distribution for sequence position pos0 + i: the
token after draft token i - 1 (row 0: after the committed sequence). The verdict is the
accepted draft tokens followed by one token of the target's: the *recovered* token at the
first rejection, or the *bonus* token after a fully accepted draft.

Greedy: accept while the draft token is the target's argmax; the target's argmax follows.

method="gumbel", sampling: the target's token at position i is argmax_x(log p_i(x) + G_i(x)),
with G_i the request's Gumbel noise for position i (sampling.Noise): exactly the token the
target alone draws there for this seed. Accept while the draft token equals it; the first
token that differs is replaced by it, and after a full match it is the bonus. So the text for
a seed is the target alone's text for that seed, whatever drafter, draft length or timing
was chosen. A draft model drafts with the same noise (argmax(log q_i + G_i)) and is accepted
with probability P(argmax(log p + G) = argmax(log q + G)) >= (1 - TV) / (1 + TV), TV being
the total variation distance between p_i and q_i; a deterministic draft x with p_i(x).

method="rejection" (Leviathan et al. 2023; Chen et al. 2023): accept draft token x with
probability min(1, p(x) / q(x)); at the first rejection draw the recovered token from
normalize(max(0, p - q)); after a full match draw the bonus from p. Acceptance is 1 - TV
per position, the most a lossless verifier can get, and the output is distributed as the
target's; but which text a seed gives depends on what was drafted. A deterministic drafter
(dists None) has q = one-hot(x): accept with probability p(x), recover from p without x.

Distributions are sparse (sampling.Candidates), so the target's and the draft's vocabularies
may differ in size (padding): a token the target cannot produce has p = 0 and is rejected,
one the draft cannot produce has q = 0. The target need not score draft tokens after the
first one it cannot produce (rows may stop there): that one is always rejected.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .sampling import ACCEPT, DRAW, RESIDUAL, Candidates, Sampler, stack


@dataclass(frozen=True)
class Verdict:
    n_accepted: int  # how many draft tokens were kept
    tokens: list[int]  # the accepted draft tokens followed by one recovered or bonus token
    # the target's probability of its most likely token at rows 0..n_accepted (after temperature,
    # top-k and top-p): how sure it was where each draft token was judged; empty when greedy
    target_top: tuple[float, ...] = ()
    # the target's processed distributions of rows 0..n_accepted, the rows that decided (None when greedy)
    target: Candidates | None = None


def verify(
    draft_tokens: Sequence[int],
    draft_dists: Sequence[Candidates] | None,  # k one-row q's, or None (a deterministic draft)
    target_logits: np.ndarray,  # [R, n_vocab] the target's logits under the request's logit_bias, penalties
                                #   and grammar (processors.py, grammar/), R = k + 1 (or fewer, see above)
    sampler: Sampler,
    pos0: int,  # the sequence position row 0 predicts
) -> Verdict:
    # Row by row, stopping at the row that decides: the rows after the first rejection cannot matter, and
    # each row costs a pass over the vocabulary (its top-k or argmax).
    k, rows = len(draft_tokens), target_logits.shape[0]
    if sampler.greedy or sampler.method == "gumbel":
        tokens, dists = [], []
        for i in range(rows):
            t, d = sampler.pick(target_logits[i : i + 1], pos0 + i)  # what the target alone picks at position i
            tokens.append(int(t[0]))
            dists.append(d)
            if i >= k or i >= rows - 1 or tokens[i] != draft_tokens[i]:
                break
        n = len(tokens) - 1
        p = None if sampler.greedy else stack(dists)
        return Verdict(n, [*draft_tokens[:n], tokens[n]], _top(p, n), p)
    n, token, dists = _verify_rejection(draft_tokens, draft_dists, target_logits, sampler, pos0)
    p = stack(dists)
    return Verdict(n, [*draft_tokens[:n], token], _top(p, n), p)


def _top(p: Candidates | None, n_accepted: int) -> tuple[float, ...]:
    """The most likely token's probability in rows 0..n_accepted."""
    return () if p is None else tuple(float(x) for x in p.top(n_accepted + 1))


def _verify_rejection(draft_tokens, draft_dists, target_logits: np.ndarray, sampler: Sampler,
                      pos0: int) -> tuple[int, int, list[Candidates]]:
    """(accepted, the recovered or bonus token, the target's distributions of rows 0..accepted)."""
    dists = []
    for i, x in enumerate(draft_tokens):
        p = sampler.process(target_logits[i : i + 1])
        dists.append(p)
        p_x = p.prob(0, x)
        q_x = 1.0 if draft_dists is None else draft_dists[i].prob(0, x)
        if p_x > 0 and sampler.noise.uniform(pos0 + i, ACCEPT) * q_x < p_x:  # u < p(x) / q(x)
            continue
        if draft_dists is None:
            residual = np.where(p.ids[0] == x, 0.0, p.probs[0])
        else:
            residual = np.maximum(p.probs[0] - _probs_at(draft_dists[i], p.ids[0]), 0.0)
        if residual.sum() <= 0:  # p == q up to rounding: any draw from p is exact
            residual = p.probs[0]
        return i, int(sampler.draw(p, pos0 + i, RESIDUAL, weights=residual[None])[0]), dists
    k = len(draft_tokens)
    p = sampler.process(target_logits[k : k + 1])
    return k, int(sampler.draw(p, pos0 + k, DRAW)[0]), [*dists, p]


def _probs_at(q: Candidates, ids: np.ndarray) -> np.ndarray:
    """q's probabilities (one row) at the token ids `ids` [W]; 0 where q has none."""
    order = np.argsort(q.ids[0])
    sorted_ids = q.ids[0][order]
    at = np.minimum(np.searchsorted(sorted_ids, ids), len(sorted_ids) - 1)
    return np.where(sorted_ids[at] == ids, q.probs[0][order][at], 0.0)


def verify_greedy(draft_tokens: Sequence[int], target_argmax: np.ndarray) -> Verdict:
    """target_argmax: [k + 1] the target's argmax token at each draft position plus the bonus."""
    for i, x in enumerate(draft_tokens):
        if int(target_argmax[i]) != x:
            return Verdict(i, [*draft_tokens[:i], int(target_argmax[i])])
    k = len(draft_tokens)
    return Verdict(k, [*draft_tokens, int(target_argmax[k])])
