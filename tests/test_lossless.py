"""Speculation must cost no quality.

Sampling: over thousands of seeded runs, the joint distribution of the first two
generated tokens with speculation matches the target's own, computed exactly from
the target's logits (no sampling noise on that side). Chi-square at p = 0.001. Both
verify methods; under gumbel the runs also test the keyed noise itself (seeds 0..N-1
must give independent draws).

Greedy: speculative output equals target-alone output token for token. llama.cpp's
batched and single-token logits can differ in the last bits and flip a near-tie, so
a divergence is accepted only where the target's top-2 logit gap is below EPS; the
test measures that gap.
"""
from __future__ import annotations

import numpy as np
import pytest

from specserve.config import SamplingParams, SpecParams
from specserve.engine import Engine
from lossless_checks import (EPS_F16, EPS_QWEN_F16, EPS_TINY, GREEDY_PROMPTS, N_RUNS, QWEN_EDIT_PROMPT, REAL_PROMPTS,
                             assert_greedy_equal, chi_square_pvalue, exact_first_two, qwen_pair,  # noqa: F401 (a fixture)
                             repeating_prompt)


@pytest.mark.parametrize(
    "target, draft, mode, sampling, method",
    [
        ("target", "draft_close", "draft", dict(temperature=0.7), "rejection"),
        ("target", "draft_close", "draft", dict(temperature=0.7), "gumbel"),
        ("target", "draft_far", "draft", dict(temperature=1.5), "rejection"),  # a poor draft: mostly the residual
        ("target", "draft_far", "draft", dict(temperature=1.5), "gumbel"),
        ("target", "draft_close", "draft", dict(temperature=1.0, top_p=0.8), "rejection"),
        ("target", "draft_close", "ngram", dict(temperature=0.7), "rejection"),
        ("target", "draft_close", "ngram", dict(temperature=1.5, top_p=0.9), "gumbel"),
        ("target", "draft_close", "draft", dict(temperature=0.9, top_k=20, min_p=0.05), "rejection"),
        # vocabularies that differ by padding, either way round
        ("target_padded", "draft_close", "draft", dict(temperature=1.0), "rejection"),
        ("target", "draft_padded", "draft", dict(temperature=1.0), "rejection"),
    ],
)
def test_sampled_speculation_matches_target_distribution(tiny_models, target, draft, mode, sampling, method):
    target = tiny_models[target]
    engine = Engine(target, tiny_models[draft], n_ctx=256)
    slot = engine.new_slot()
    prompt = repeating_prompt(engine, slot)
    base = SamplingParams(max_tokens=3, **sampling)
    expected = exact_first_two(target, prompt, base)
    counts: dict[tuple[int, int], int] = {}
    drafted = accepted = 0
    for seed in range(N_RUNS):
        params = SamplingParams(max_tokens=3, seed=seed, ignore_eos=True, **sampling)
        g = slot.generate(prompt, params, SpecParams(mode=mode, draft_max=2), method)
        key = (g.tokens[0], g.tokens[1])
        counts[key] = counts.get(key, 0) + 1
        drafted += g.stats.n_drafted
        accepted += g.stats.n_accepted
    slot.close()
    assert drafted >= N_RUNS, "speculation must actually have drafted for this test to mean anything"
    assert 0 < accepted < drafted  # both the accept and the reject paths were exercised
    p = chi_square_pvalue(counts, expected, N_RUNS)
    assert p > 1e-3, f"distribution differs from the target's (chi-square p = {p:.2e})"


def test_chi_square_detects_a_biased_sampler(tiny_models):
    """The test above can fail: a sampler that drops the temperature is caught."""
    target = tiny_models["target"]
    prompt = target.tokenize("the cat sat on the mat")
    expected = exact_first_two(target, prompt, SamplingParams(temperature=1.5))
    wrong = exact_first_two(target, prompt, SamplingParams(temperature=1.0))
    rng = np.random.default_rng(0)
    keys = list(wrong)
    draws = rng.choice(len(keys), size=N_RUNS, p=np.array([wrong[k] for k in keys]) / sum(wrong.values()))
    counts: dict = {}
    for i in draws:
        counts[keys[i]] = counts.get(keys[i], 0) + 1
    assert chi_square_pvalue(counts, expected, N_RUNS) < 1e-3


# --- greedy -------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode, draft, draft_max", [("draft", "draft_close", 4), ("draft", "draft_far", 8),
                                                    ("ngram", "draft_close", 8), ("auto", "draft_close", 8)])
def test_greedy_speculation_equals_target_alone_tiny(tiny_models, mode, draft, draft_max):
    target = tiny_models["target"]
    engine = Engine(target, tiny_models[draft], n_ctx=256)
    slot = engine.new_slot()
    drafted = 0
    for text in GREEDY_PROMPTS:
        prompt = target.tokenize(text)
        params = SamplingParams(max_tokens=60, ignore_eos=True)
        reference = slot.generate(prompt, params, SpecParams(mode="none")).tokens
        g = slot.generate(prompt, params, SpecParams(mode=mode, draft_max=draft_max))
        drafted += g.stats.n_drafted
        assert_greedy_equal(target, prompt, reference, g.tokens, EPS_TINY, f"{mode}/{draft} on {text!r}")
    slot.close()
    if mode != "auto":
        assert drafted > 0


@pytest.fixture(scope="module")
def real_pair(real_model_paths):
    from specserve.backends import load_model

    target = load_model(str(real_model_paths["smollm2-f16"]))
    draft = load_model(str(real_model_paths["smollm2-q4_1"]))
    yield target, draft
    target.close()
    draft.close()


@pytest.mark.parametrize("mode", ["draft", "ngram"])
def test_greedy_speculation_equals_target_alone_real_smollm2(real_pair, mode):
    from specserve.prompt import prompt_tokens

    target, draft = real_pair
    slot = Engine(target, draft, n_ctx=1024).new_slot()
    accepted = 0
    for text in REAL_PROMPTS:
        prompt = prompt_tokens(target, text, chat=True)
        params = SamplingParams(max_tokens=48)
        reference = slot.generate(prompt, params, SpecParams(mode="none")).tokens
        g = slot.generate(prompt, params, SpecParams(mode=mode, draft_max=6))
        accepted += g.stats.n_accepted
        assert_greedy_equal(target, prompt, reference, g.tokens, EPS_F16, f"{mode} on {text!r}")
    slot.close()
    assert accepted > 0


@pytest.mark.real_models
def test_greedy_speculation_equals_target_alone_qwen_reference_pair(qwen_pair):
    """A few hundred tokens of a code edit: the draft model and prompt lookup give the target's own text."""
    from specserve.prompt import prompt_tokens

    target, draft = qwen_pair
    slot = Engine(target, draft, n_ctx=1024).new_slot()
    prompt = prompt_tokens(target, QWEN_EDIT_PROMPT, chat=True)
    params = SamplingParams(max_tokens=200)
    reference = slot.generate(prompt, params, SpecParams(mode="none")).tokens
    assert len(reference) >= 60  # the whole file comes back
    for mode in ("draft", "ngram"):
        g = slot.generate(prompt, params, SpecParams(mode=mode, draft_max=8))
        assert g.stats.n_accepted > len(reference) // 3, mode  # a copy-heavy edit: most of it is drafted
        assert_greedy_equal(target, prompt, reference, g.tokens, EPS_QWEN_F16, f"{mode} on the code edit")
    slot.close()
