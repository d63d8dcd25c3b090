"""Is this output the target alone's output (greedy, or sampled with the same seed), up to numerics?

Under --verify gumbel the token at position i is argmax(log p_i + G_i) whatever was
speculated. Batched and one-token-at-a-time passes round differently, so two runs may
part where the best two scores are nearly equal; a divergence is accepted only there,
and the test measures that gap from the target evaluated one token at a time.
"""
from __future__ import annotations

import numpy as np

from specserve.config import SamplingParams


def score_gap(model, prompt: list[int], before: list[int], params: SamplingParams) -> float:
    """The gap between the best two log p + G scores of the target at the token after prompt + before
    (greedy: its best two logits), under the request's logit_bias and penalties."""
    from specserve.sampling import Sampler

    ctx = model.new_context(len(prompt) + len(before) + 8)
    try:
        logits = ctx.eval([*prompt, *before], logits="last")[0].copy()
    finally:
        ctx.close()
    sampler = Sampler(params)
    if sampler.rules is not None:
        logits = sampler.rules.apply(logits, [*prompt, *before])
    if sampler.greedy:
        top = np.sort(logits)[-2:]
        return float(top[1] - top[0])
    dist = sampler.process(logits)
    with np.errstate(divide="ignore"):
        scores = np.log(dist.probs[0].astype(np.float64)) + sampler.noise.gumbel(len(prompt) + len(before), dist.ids)[0]
    top = np.sort(scores)[-2:]
    return float(top[1] - top[0]) if np.isfinite(top[0]) else np.inf


def assert_same_sampled_text(model, prompt: list[int], params: SamplingParams, reference: list[int],
                             tokens: list[int], eps: float, label: str = "") -> None:
    """Equal token for token, or parting only where the target's best two scores are within eps
    (greedy too: its best two logits)."""
    n = min(len(reference), len(tokens))
    diverge = next((i for i in range(n) if reference[i] != tokens[i]), None)
    if diverge is None:
        assert len(reference) == len(tokens), f"{label}: {len(reference)} vs {len(tokens)} tokens"
        return
    gap = score_gap(model, prompt, reference[:diverge], params)
    assert gap < eps, f"{label}: diverged at token {diverge} where the best two scores are {gap:.4f} apart"


def assert_same_logprobs(reference: list, logprobs: list, tol: float, label: str = "") -> None:
    """Two runs' logprobs (logprobs.TokenLogprob lists) of the same tokens: the same ids, values within
    tol, the same alternatives in the same order, except that two alternatives may trade places where
    their values are within tol of each other (then the values at that rank agree within tol)."""
    assert [t.id for t in reference] == [t.id for t in logprobs], label
    for i, (a, b) in enumerate(zip(reference, logprobs)):
        assert abs(a.logprob - b.logprob) < tol, f"{label}: token {i}: {a.logprob} vs {b.logprob}"
        assert len(a.top) == len(b.top), f"{label}: token {i}: {len(a.top)} vs {len(b.top)} alternatives"
        for rank, ((id_a, lp_a), (id_b, lp_b)) in enumerate(zip(a.top, b.top)):
            assert abs(lp_a - lp_b) < tol, f"{label}: token {i}, rank {rank}: {id_a} {lp_a} vs {id_b} {lp_b}"
        b_values = dict(b.top)
        for id_a, lp_a in a.top:
            assert id_a not in b_values or abs(lp_a - b_values[id_a]) < tol, f"{label}: token {i}, id {id_a}"
