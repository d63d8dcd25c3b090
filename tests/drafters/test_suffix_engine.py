"""The suffix drafter in the engine: lossless with the cross-request store, and its opt-outs.

Tiny models the suite writes itself. The sampled test drafts from a store that fills with
the earlier runs' own samples: drafts then depend on earlier randomness, never on the
current run's, so the output distribution must still be the target's exactly.
"""
from __future__ import annotations

import pytest

from specserve.config import SamplingParams, SpecParams, draft_max_caps_suffix
from specserve.drafters.suffix_store import SuffixStore
from specserve.engine import Engine
from lossless_checks import (EPS_TINY, GREEDY_PROMPTS, N_RUNS, assert_greedy_equal, chi_square_pvalue,
                           exact_first_two, qwen_pair, repeating_prompt)  # noqa: F401 (qwen_pair: a fixture)

GREEDY = SamplingParams(max_tokens=60, ignore_eos=True)


@pytest.fixture
def engine(tiny_models):
    return Engine(tiny_models["target"], None, n_ctx=512, suffix_store=SuffixStore(4 << 20))


def test_greedy_suffix_equals_target_alone_and_a_repeat_drafts_from_the_store(engine, tiny_models):
    target, slot = tiny_models["target"], engine.new_slot()
    first_passes = repeat_passes = 0
    for text in GREEDY_PROMPTS:
        prompt = target.tokenize(text)
        reference = slot.generate(prompt, GREEDY, SpecParams(mode="none", cross_request=False)).tokens
        first = slot.generate(prompt, GREEDY, SpecParams(mode="suffix"))
        repeat = slot.generate(prompt, GREEDY, SpecParams(mode="suffix"))
        for g, label in ((first, "first"), (repeat, "repeat")):
            assert_greedy_equal(target, prompt, reference, g.tokens, EPS_TINY, f"suffix {label} on {text!r}")
        first_passes += first.stats.n_passes
        repeat_passes += repeat.stats.n_passes
    slot.close()
    assert engine.suffix_store.n_docs == 2 * len(GREEDY_PROMPTS)  # the opted-out reference runs were not stored
    # the repeat is drafted from the first run's answer: 60 tokens in at most 3 passes (these prompts
    # are short: the first matches are 4- and 8-token windows, which draft 8 and 16 tokens)
    assert repeat_passes <= 3 * len(GREEDY_PROMPTS) and 4 * repeat_passes < first_passes


@pytest.mark.parametrize("sampling", [dict(temperature=0.7), dict(temperature=1.5, top_p=0.9)])
def test_sampled_suffix_matches_target_distribution(tiny_models, sampling):
    target = tiny_models["target"]
    engine = Engine(target, None, n_ctx=256, suffix_store=SuffixStore(2 << 20))  # evicts as it goes
    slot = engine.new_slot()
    prompt = repeating_prompt(engine, slot)
    expected = exact_first_two(target, prompt, SamplingParams(max_tokens=3, **sampling))
    counts: dict[tuple[int, int], int] = {}
    drafted = accepted = 0
    for seed in range(N_RUNS):
        params = SamplingParams(max_tokens=3, seed=seed, ignore_eos=True, **sampling)
        g = slot.generate(prompt, params, SpecParams(mode="suffix", suffix_max=2))
        key = (g.tokens[0], g.tokens[1])
        counts[key] = counts.get(key, 0) + 1
        drafted += g.stats.n_drafted
        accepted += g.stats.n_accepted
    slot.close()
    assert drafted >= N_RUNS and 0 < accepted < drafted
    assert engine.suffix_store.nbytes <= engine.suffix_store.max_bytes
    p = chi_square_pvalue(counts, expected, N_RUNS)
    assert p > 1e-3, f"distribution differs from the target's (chi-square p = {p:.2e})"


def test_opt_outs_neither_read_nor_feed_the_store(engine, tiny_models):
    target, slot = tiny_models["target"], engine.new_slot()
    prompt = target.tokenize("the dog ran in the park and")
    store = engine.suffix_store

    def run(**spec):
        return slot.generate(prompt, GREEDY, SpecParams(mode="suffix", **spec)).stats

    alone = run(cross_request=False)  # what this request drafts from itself
    assert store.n_docs == 0
    run(cross_request_scope="tenant-a")
    assert store.n_docs == 1
    for other in (dict(cross_request=False), dict(cross_request_scope="tenant-b")):
        s = run(**other)
        assert (s.n_drafted, s.n_passes) == (alone.n_drafted, alone.n_passes), other  # nothing from tenant-a
    assert store.n_docs == 2  # tenant-b's answer was stored (in its own scope); the opted-out one was not
    again = run(cross_request_scope="tenant-a")
    assert again.n_passes < alone.n_passes  # tenant-a does see its own earlier answer
    # a request stopped before it finished is not stored
    stream = slot.stream(prompt, GREEDY, SpecParams(mode="suffix", cross_request_scope="tenant-c"))
    next(stream)
    stream.close()
    assert store.n_docs == 3
    slot.close()


def test_an_engine_without_a_store_drafts_from_the_request_alone(tiny_models):
    target = tiny_models["target"]
    slot = Engine(target, None, n_ctx=256).new_slot()
    prompt = target.tokenize("a b c d e f g a b c")
    g = slot.generate(prompt, SamplingParams(max_tokens=20, ignore_eos=True), SpecParams(mode="suffix"))
    assert g.stats.n_generated == 20
    slot.close()


def test_request_fields_map_onto_spec_params():
    assert SpecParams().suffix_max == 64 and SpecParams().cross_request
    # a draft_max the user sets caps the suffix drafter too, unless suffix_max is set as well
    assert SpecParams(**draft_max_caps_suffix({"draft_max": 8}, ["draft_max"])).suffix_max == 8
    assert SpecParams(**draft_max_caps_suffix({"draft_max": 8, "suffix_max": 32}, ["draft_max", "suffix_max"])
                      ).suffix_max == 32
    assert SpecParams(**draft_max_caps_suffix({"draft_max": 8}, [])).suffix_max == 64  # a default, not set
    with pytest.raises(ValueError, match="suffix_max"):
        SpecParams(suffix_max=65)




def test_cli_and_profiles_cap_the_suffix_drafter_only_where_draft_max_is_set():
    import argparse

    from specserve.cli.common import add_spec_args, spec_params
    from specserve.server.core.model_presets import Profile, parse_profile

    p = argparse.ArgumentParser()
    add_spec_args(p)
    unset = spec_params(p.parse_args(["--spec", "suffix"]))
    assert (unset.draft_max, unset.suffix_max) == (8, 64)
    assert spec_params(p.parse_args(["--spec", "suffix", "--draft-max", "16"])).suffix_max == 16
    base = Profile("m", spec={"mode": "auto"})
    assert parse_profile("p=spec=suffix,draft_max=16", base).spec["suffix_max"] == 16
    private = parse_profile("p=cross_request=false,cross_request_scope=team-a", base).spec
    assert private["cross_request"] is False and private["cross_request_scope"] == "team-a"


def test_greedy_suffix_repeat_equals_target_alone_real_smollm2(real_model_paths):
    """64-token drafts verified in one batch: the F16 target still says what it says alone."""
    from specserve.backends import load_model
    from specserve.prompt import prompt_tokens
    from lossless_checks import EPS_F16, REAL_PROMPTS

    target = load_model(str(real_model_paths["smollm2-f16"]))
    slot = Engine(target, None, n_ctx=1024, suffix_store=SuffixStore(8 << 20)).new_slot()
    params = SamplingParams(max_tokens=48)
    accepted = generated = 0
    try:
        for text in REAL_PROMPTS:
            prompt = prompt_tokens(target, text, chat=True)
            reference = slot.generate(prompt, params, SpecParams(mode="none", cross_request=False)).tokens
            for run in ("first", "repeat"):
                g = slot.generate(prompt, params, SpecParams(mode="suffix"))
                assert_greedy_equal(target, prompt, reference, g.tokens, EPS_F16, f"suffix {run} on {text!r}")
            accepted, generated = accepted + g.stats.n_accepted, generated + g.stats.n_generated
    finally:
        slot.close()
        target.close()
    # the repeats were drafted from the first answers, 64 tokens a pass (all of an answer in one pass,
    # unless a near-tie flips between a long batch and the first run's shorter ones)
    assert accepted >= 0.6 * generated


@pytest.mark.real_models
def test_greedy_auto_repeat_after_another_request_equals_target_alone_qwen_reference_pair(qwen_pair):
    """The reference pair under auto: a code edit, another request, the edit again. The store offers
    the repeat its earlier answer as the same request, and the repeat is still the target's own text.
    (How many passes auto copies it in follows the pass costs it measures: one, on a quiet machine;
    tests/auto/test_repeats.py holds the plan on fixed costs.)"""
    from specserve.drafters.suffix import SAME_REQUEST, SuffixDrafter
    from specserve.prompt import prompt_tokens
    from lossless_checks import EPS_QWEN_F16, QWEN_EDIT_PROMPT

    target, draft = qwen_pair
    engine = Engine(target, draft, n_ctx=1024, suffix_store=SuffixStore(8 << 20))
    slot = engine.new_slot()
    prompt = prompt_tokens(target, QWEN_EDIT_PROMPT, chat=True)
    params = SamplingParams(max_tokens=64)
    try:
        reference = slot.generate(prompt, params, SpecParams(mode="none", cross_request=False)).tokens
        first = slot.generate(prompt, params, SpecParams())
        slot.generate(prompt_tokens(target, "Say hello in one short sentence.", chat=True),
                      SamplingParams(max_tokens=12), SpecParams())
        assert SuffixDrafter(engine.suffix_store).match(prompt) == (SAME_REQUEST, 64)
        again = slot.generate(prompt, params, SpecParams())
    finally:
        slot.close()
    assert len(reference) == 64
    for g, label in ((first, "first"), (again, "repeat")):
        assert_greedy_equal(target, prompt, reference, g.tokens, EPS_QWEN_F16, f"auto {label} on the code edit")
    assert again.stats.drafter_steps["suffix"] >= 1
