"""The micro-batch (-ub, -ubd): how many tokens llama.cpp computes at once in a context, which sizes its
compute buffer. A pass of more is split by llama.cpp into passes of that many; what comes back is the same.

The draft model's contexts take a small one (its steps are a few tokens): llama.cpp's reported buffer is
the estimate's at that size, the draft's prompt and catch-ups go through in pieces, and speculation stays
lossless, greedy and sampled.
"""
from __future__ import annotations

import numpy as np
import pytest

from specserve import memory
from specserve.config import UBATCH_DEFAULT, UBATCH_DRAFT_DEFAULT, SamplingParams, SpecParams
from specserve.engine import Engine
from lossless_checks import EPS_TINY, GREEDY_PROMPTS, N_RUNS, assert_greedy_equal, chi_square_pvalue, \
    exact_first_two, repeating_prompt

PROMPT = "the cat sat on the mat and the dog ran in the park " * 4


@pytest.mark.parametrize("n_ubatch", [4, 16, 64, 512])
def test_the_compute_buffer_is_the_estimate_at_the_micro_batch(tiny_models, tiny_paths, n_ubatch):
    shape = memory.ModelShape.from_gguf(tiny_paths["target"])
    ctx = tiny_models["target"].new_context(1024, n_ubatch=n_ubatch)
    try:
        assert ctx.n_ubatch == n_ubatch and ctx.n_batch == 512
        estimated = shape.compute_bytes(1024, n_ubatch)
        assert abs(ctx.compute_bytes - estimated) <= 0.02 * ctx.compute_bytes + 0.02 * 2**20  # the log's 2 places
    finally:
        ctx.close()


def test_a_pass_longer_than_the_micro_batch_gives_the_same_logits(tiny_models):
    target = tiny_models["target"]
    tokens = target.tokenize(PROMPT)
    assert len(tokens) > 3 * 8
    out = {}
    for n_ubatch in (8, 512):
        ctx = target.new_context(256, n_ubatch=n_ubatch)
        try:
            last = ctx.eval(tokens, "last")[0].copy()
            rows = ctx.eval(tokens[:20], "all").copy()  # 20 rows of logits across three micro-batches
            out[n_ubatch] = (last, rows, list(ctx.tokens))
        finally:
            ctx.close()
    (a_last, a_rows, a_tokens), (b_last, b_rows, b_tokens) = out[8], out[512]
    assert a_tokens == b_tokens == tokens + tokens[:20]
    assert np.abs(a_last - b_last).max() < 1e-2 and np.abs(a_rows - b_rows).max() < 1e-2


def test_the_engine_gives_each_model_its_micro_batch(tiny_models):
    engine = Engine(tiny_models["target"], tiny_models["draft_close"], n_ctx=512)
    assert (engine.n_ubatch, engine.n_ubatch_draft) == (UBATCH_DEFAULT, UBATCH_DRAFT_DEFAULT)
    engine.n_ubatch, engine.n_ubatch_draft = 64, 4
    slot = engine.new_slot()
    shared = engine.new_slots(2)
    try:
        assert slot.ctx.n_ubatch == 64 and slot.draft_ctx.n_ubatch == 4
        assert shared[0].ctx.shared.n_ubatch == 64 and shared[0].draft_ctx.shared.n_ubatch == 4
        # llama.cpp's own figure: the draft's buffer is the one for 4 tokens, not 512
        at_512 = tiny_models["draft_close"].new_context(512)
        try:
            assert slot.draft_ctx.memory().compute < at_512.memory().compute / 8
        finally:
            at_512.close()
    finally:
        for s in [slot, *shared]:
            s.close()


@pytest.mark.parametrize("mode, draft_max", [("draft", 4), ("draft", 8), ("auto", 8)])
def test_greedy_speculation_with_small_micro_batches_is_the_target_alone(tiny_models, mode, draft_max):
    """-ubd 2: every catch-up and prompt of the draft is split; -ub 4: verifications too."""
    target = tiny_models["target"]
    engine = Engine(target, tiny_models["draft_close"], n_ctx=256)
    engine.n_ubatch, engine.n_ubatch_draft = 4, 2
    slot = engine.new_slot()
    drafted = 0
    for text in GREEDY_PROMPTS + [PROMPT]:
        prompt = target.tokenize(text)
        params = SamplingParams(max_tokens=60, ignore_eos=True)
        reference = Engine(target, None, n_ctx=256).new_slot().generate(prompt, params, SpecParams(mode="none"))
        g = slot.generate(prompt, params, SpecParams(mode=mode, draft_max=draft_max))
        drafted += g.stats.n_drafted
        assert_greedy_equal(target, prompt, reference.tokens, g.tokens, EPS_TINY, f"{mode} on {text!r}")
    slot.close()
    if mode != "auto":
        assert drafted > 0


@pytest.mark.parametrize("method", ["rejection", "gumbel"])
def test_sampled_speculation_with_a_small_draft_micro_batch_matches_the_target(tiny_models, method):
    target = tiny_models["target"]
    engine = Engine(target, tiny_models["draft_close"], n_ctx=256)
    engine.n_ubatch_draft = 2
    slot = engine.new_slot()
    prompt = repeating_prompt(engine, slot)
    sampling = dict(temperature=0.7)
    expected = exact_first_two(target, prompt, SamplingParams(max_tokens=3, **sampling))
    counts: dict[tuple[int, int], int] = {}
    drafted = accepted = 0
    for seed in range(N_RUNS):
        params = SamplingParams(max_tokens=3, seed=seed, ignore_eos=True, **sampling)
        g = slot.generate(prompt, params, SpecParams(mode="draft", draft_max=2), method)
        counts[(g.tokens[0], g.tokens[1])] = counts.get((g.tokens[0], g.tokens[1]), 0) + 1
        drafted += g.stats.n_drafted
        accepted += g.stats.n_accepted
    slot.close()
    assert drafted >= N_RUNS and 0 < accepted < drafted
    p = chi_square_pvalue(counts, expected, N_RUNS)
    assert p > 1e-3, f"distribution differs from the target's (chi-square p = {p:.2e})"


@pytest.mark.real_models
def test_reference_pair_seeded_sampling_with_the_draft_at_its_micro_batch_is_the_target_alone():
    """The reference pair as the engine makes it (draft at -ubd 64: llama.cpp allocates 37.5 MiB for it, not
    300 MiB): seeded sampling under gumbel gives the target alone's text, token for token up to near-ties."""
    from equality import assert_same_sampled_text
    from specserve import models
    from specserve.backends import load_model
    from specserve.prompt import prompt_tokens

    target = load_model(str(models.ensure("qwen2.5-coder-1.5b-f16")))
    draft = load_model(str(models.ensure("qwen2.5-coder-0.5b")))
    try:
        slot = Engine(target, draft, n_ctx=1024).new_slot()
        assert slot.draft_ctx.n_ubatch == UBATCH_DRAFT_DEFAULT == 64
        assert 37 * 2**20 < slot.draft_ctx.memory().compute < 38 * 2**20  # llama.cpp's figure
        prompt = prompt_tokens(target, "Write a Python function that reverses a linked list.", chat=True)
        params = SamplingParams(max_tokens=48, temperature=0.8, seed=7)
        reference = slot.generate(prompt, params, SpecParams(mode="none"), "gumbel").tokens
        g = slot.generate(prompt, params, SpecParams(mode="draft", draft_max=8), "gumbel")
        assert g.stats.n_accepted > 0
        assert_same_sampled_text(target, prompt, params, reference, g.tokens, 0.02, "draft at -ubd 64")
        slot.close()
    finally:
        target.close()
        draft.close()
