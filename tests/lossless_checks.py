"""What the losslessness tests share (test_lossless.py, and the drafters', backends' and grammar's tests
that hold their own paths to the same bar): the prompts, the tolerances, the exact joint distribution of
the first two tokens and Pearson's chi-square against it, the greedy comparison that accepts a divergence
only at a measured near-tie, and the reference pair.
"""
from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chi2

from specserve.config import SamplingParams, SpecParams
from specserve.engine import Engine
from specserve.sampling import process


N_RUNS = 3000


def repeating_prompt(engine: Engine, slot) -> list[int]:
    """A prompt whose end repeats its start, followed in between by the target's own greedy
    continuation: the n-gram drafter then proposes what the target is likely to say."""
    start = engine.target.tokenize("the cat sat")
    own = slot.generate(start, SamplingParams(max_tokens=8, ignore_eos=True), SpecParams(mode="none")).tokens
    return start + own + start


def exact_first_two(model, prompt_tokens, params) -> dict[tuple[int, int], float]:
    """P(t1, t2) under the target alone, from its logits evaluated one token at a time."""
    ctx = model.new_context(256)
    try:
        p1 = process(ctx.eval(prompt_tokens)[0].copy(), params)
        joint = {}
        for t1 in np.flatnonzero(p1):
            ctx.truncate(len(prompt_tokens))
            p2 = process(ctx.eval([int(t1)])[0].copy(), params)
            for t2 in np.flatnonzero(p2):
                joint[(int(t1), int(t2))] = p1[t1] * p2[t2]
        return joint
    finally:
        ctx.close()


def chi_square_pvalue(counts: dict, expected_p: dict, n: int) -> float:
    """Pearson chi-square of observed counts against exact probabilities; rare cells pooled."""
    assert set(counts) <= set(expected_p), f"impossible outcomes: {set(counts) - set(expected_p)}"
    obs, exp, pooled_obs, pooled_exp = [], [], 0, 0.0
    for key, p in expected_p.items():
        if p * n >= 5:
            obs.append(counts.get(key, 0))
            exp.append(p * n)
        else:
            pooled_obs += counts.get(key, 0)
            pooled_exp += p * n
    if pooled_exp > 0:
        obs.append(pooled_obs)
        exp.append(pooled_exp)
    obs, exp = np.array(obs, float), np.array(exp, float)
    stat = float(((obs - exp) ** 2 / exp).sum())
    return float(chi2.sf(stat, df=max(len(obs) - 1, 1)))


EPS_TINY = 1e-2  # the F16 KV cache makes batched and single-token logits differ by up to ~3e-3 here


GREEDY_PROMPTS = ["the cat sat on the mat", "once upon a time there was", "hello world hello", "a b c d e f g"]


def top2_gaps(model, prompt_tokens, generated) -> list[float]:
    """The target's top-2 logit gap before each generated token, evaluated one token at a time."""
    ctx = model.new_context(512)
    try:
        gaps = []
        logits = ctx.eval(prompt_tokens)[0]
        for t in generated:
            top = np.sort(logits)[-2:]
            gaps.append(float(top[1] - top[0]))
            logits = ctx.eval([t])[0]
        return gaps
    finally:
        ctx.close()


def assert_greedy_equal(model, prompt, reference, spec_tokens, eps, label):
    """Equal token for token, or diverging only at a measured near-tie."""
    n = min(len(reference), len(spec_tokens))
    diverge = next((i for i in range(n) if reference[i] != spec_tokens[i]), None)
    if diverge is None:
        assert len(reference) == len(spec_tokens), label
        return
    gap = top2_gaps(model, prompt, reference[: diverge + 1])[diverge]
    assert gap < eps, f"{label}: diverged at token {diverge} where the top-2 gap is {gap:.4f} >= {eps}"


EPS_F16 = 0.02  # F16 SmolLM2: batched vs single-token logits differ by far less (ANCHORS: smallest gap seen 0.002)


REAL_PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Rewrite this sentence in the passive voice: The committee approved the new budget.",
    "List three uses of a hash map, each with one sentence.",
]


EPS_QWEN_F16 = 0.02  # same rule as SmolLM2's F16: a divergence must sit on a near-tie of the target's logits


QWEN_EDIT_PROMPT = (
    "Rename the function `area` to `rectangle_area` and return the whole file.\n\n```python\n"
    "def area(width, height):\n    \"\"\"Area of a rectangle.\"\"\"\n    if width < 0 or height < 0:\n"
    "        raise ValueError(\"negative size\")\n    return width * height\n\n\n"
    "def total_area(rectangles):\n    return sum(area(w, h) for w, h in rectangles)\n```\n")


@pytest.fixture(scope="module")
def qwen_pair():
    """The reference pair: Qwen2.5-Coder-1.5B F16 target (from the Q4_K_M weights) and the 0.5B draft."""
    from specserve import models
    from specserve.backends import load_model

    target = load_model(str(models.ensure("qwen2.5-coder-1.5b-f16")))
    draft = load_model(str(models.ensure("qwen2.5-coder-0.5b")))
    yield target, draft
    target.close()
    draft.close()
