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

from .sampling import ACCEPT, DRAW, RESIDUAL, Candidates, Sampler


@dataclass(frozen=True)
class Verdict:
    n_accepted: int  # how many draft tokens were kept
    tokens: list[int]  # the accepted draft tokens followed by one recovered or bonus token
    # the target's probability of its most likely token at rows 0..n_accepted (after temperature,
    # top-k and top-p): how sure it was where each draft token was judged; empty when greedy
    target_top: tuple[float, ...] = ()
    # the target's processed distributions of the rows it verified (None when greedy: one-hot at the argmax)
    target: Candidates | None = None


def verify(
    draft_tokens: Sequence[int],
    draft_dists: Sequence[Candidates] | None,  # k one-row q's, or None (a deterministic draft)
    target_logits: np.ndarray,  # [R, n_vocab] the target's logits under the request's logit_bias, penalties
                                #   and grammar (processors.py, grammar/), R = k + 1 (or fewer, see above)
    sampler: Sampler,
    pos0: int,  # the sequence position row 0 predicts
) -> Verdict:
    k, rows = len(draft_tokens), target_logits.shape[0]
    if sampler.greedy or sampler.method == "gumbel":
        target_tokens, p = sampler.pick(target_logits, pos0)  # [R] what the target alone picks at each position
        n = next((i for i, x in enumerate(draft_tokens) if i >= rows - 1 or int(target_tokens[i]) != x), k)
        return Verdict(n, [*draft_tokens[:n], int(target_tokens[n])], _top(p, n), p)
    p = sampler.process(target_logits)
    v = _verify_rejection(draft_tokens, draft_dists, p, sampler, pos0)
    return Verdict(v.n_accepted, v.tokens, _top(p, v.n_accepted), p)


def _top(p: Candidates | None, n_accepted: int) -> tuple[float, ...]:
    """The most likely token's probability in rows 0..n_accepted."""
    return () if p is None else tuple(float(x) for x in p.top(n_accepted + 1))


def _verify_rejection(draft_tokens, draft_dists, p: Candidates, sampler: Sampler, pos0: int) -> Verdict:
    k = len(draft_tokens)
    for i, x in enumerate(draft_tokens):
        p_x = p.prob(i, x)
        q_x = 1.0 if draft_dists is None else draft_dists[i].prob(0, x)
        if p_x > 0 and sampler.noise.uniform(pos0 + i, ACCEPT) * q_x < p_x:  # u < p(x) / q(x)
            continue
        if draft_dists is None:
            residual = np.where(p.ids[i] == x, 0.0, p.probs[i])
        else:
            residual = np.maximum(p.probs[i] - _probs_at(draft_dists[i], p.ids[i]), 0.0)
        if residual.sum() <= 0:  # p == q up to rounding: any draw from p is exact
            residual = p.probs[i]
        recovered = sampler.draw(p.row(i), pos0 + i, RESIDUAL, weights=residual[None])[0]
        return Verdict(i, [*draft_tokens[:i], int(recovered)])
    return Verdict(k, [*draft_tokens, int(sampler.draw(p.row(k), pos0 + k, DRAW)[0])])


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
