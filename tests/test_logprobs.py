"""Logprobs under speculation are the target alone's: the same tokens, the same alternatives in the same
order, values equal up to the batched kernels' rounding.

The tolerance. A logprob is z_t - logsumexp(z): logits that a batched pass and a one-token pass round
differently (ANCHORS "Greedy numerics") move it by about twice their error. The tiny models' F16 KV
cache moves logits by up to ~3e-3 (lossless_checks.EPS_TINY): 1e-2. The F16 SmolLM2 and Qwen targets
moved logprobs by up to 0.035 here (SmolLM2: 2 chat prompts x 48 tokens x 21 values, greedy and at
0.8, every spec mode against the target alone and against a whole-prompt reference pass): 0.05.
What a wrong distribution would give (tempered, biased, a row off by one) is far outside both; the
first tiny test shows the processed distribution at 0.8 parts from the raw one by more. Where greedy
or seeded text itself parts at a near-tie (test_lossless), logprobs are compared up to that token.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from scipy.special import log_softmax

from equality import assert_same_logprobs, assert_same_sampled_text
from specserve.config import SamplingParams, SpecParams
from specserve.engine import Engine
from specserve.logprobs import TokenLogprob, processed, raw
from specserve.sampling import candidates
from lossless_checks import EPS_F16, EPS_TINY, assert_greedy_equal, qwen_pair  # noqa: F401  (a module fixture)

TOL = 1e-2
TOL_F16 = 0.05
MODES = [("none", 1), ("draft", 4), ("ngram", 6), ("suffix", 8), ("auto", 8)]
SAMPLINGS = [dict(), dict(temperature=0.8, seed=5), dict(temperature=1.2, top_k=20, top_p=0.9, seed=11)]


def run(slot, prompt, params, spec) -> tuple[list[int], list[TokenLogprob], int]:
    """Tokens and logprobs through the stream, checking that every chunk has one logprob per token."""
    tokens, lps, drafted = [], [], 0
    for chunk in slot.stream(prompt, params, spec):
        assert chunk.logprobs is not None and [t.id for t in chunk.logprobs] == chunk.tokens
        tokens += chunk.tokens
        lps += chunk.logprobs
        drafted += chunk.n_drafted
    return tokens, lps, drafted


def assert_same_run(model, prompt, params, alone, alone_lps, tokens, lps, eps, tol, label) -> int:
    """The same text (or parting only at a near-tie, whose gap the target alone measures: eps) and the
    same logprobs (within tol) up to where it parts; returns how many tokens were compared."""
    if params.greedy:
        assert_greedy_equal(model, prompt, alone, tokens, eps, label)
    else:
        assert_same_sampled_text(model, prompt, params, alone, tokens, eps, label)
    n = next((i for i, (a, b) in enumerate(zip(alone, tokens)) if a != b), min(len(alone), len(tokens)))
    assert_same_logprobs(alone_lps[:n], lps[:n], tol, label)
    return n


def reference_logprobs(model, prompt: list[int], tokens: list[int], n_top: int) -> list[TokenLogprob]:
    """The target alone, one token a pass, through scipy's log_softmax: an independent computation."""
    ctx = model.new_context(len(prompt) + len(tokens) + 8)
    try:
        out, row = [], ctx.eval(prompt)[0].astype(np.float64)
        for t in tokens:
            lp = log_softmax(row)
            top = np.lexsort((np.arange(len(lp)), -lp))[:n_top]  # a full sort by (-logprob, id)
            out.append(TokenLogprob(t, float(lp[t]), tuple((int(i), float(lp[i])) for i in top)))
            row = ctx.eval([t])[0].astype(np.float64)
        return out
    finally:
        ctx.close()


# --- the arithmetic ---------------------------------------------------------------------------------


def test_raw_logprobs_are_the_log_softmax_and_its_top_most_likely_first_ties_by_id():
    logits = np.array([[1.0, 3.0, 3.0, -2.0, 0.5], [0.0, 0.0, 0.0, 0.0, 9.0]], np.float32)
    got = raw(logits, [0, 4], 3)
    lp = log_softmax(logits.astype(np.float64), axis=1)
    assert [t.id for t in got] == [0, 4]
    assert got[0].logprob == pytest.approx(lp[0, 0], abs=1e-6) and got[1].logprob == pytest.approx(lp[1, 4], abs=1e-6)
    assert [i for i, _ in got[0].top] == [1, 2, 0]  # 1 and 2 tie: the lower id first
    assert [i for i, _ in got[1].top] == [4, 0, 1]  # four tie for second place: the lowest ids
    assert all(v == pytest.approx(lp[r, i], abs=1e-6) for r in range(2) for i, v in got[r].top)
    assert raw(logits, [1], 0)[0].top == () and raw(logits, [], 5) == []


def test_processed_logprobs_come_from_the_distribution_the_token_was_drawn_from():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]], np.float32))
    dist = candidates(logits, SamplingParams(temperature=1.0, top_p=0.8))  # keeps 0.5 and 0.3
    got = processed(dist, [1], 4)[0]
    assert got.logprob == pytest.approx(np.log(0.3 / 0.8), abs=1e-6)
    assert [i for i, _ in got.top] == [0, 1]  # tokens cut by top-p are not alternatives
    greedy = processed(None, [2], 3)[0]
    assert greedy.logprob == 0.0 and greedy.top == ((2, 0.0),)


# --- the engine ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_logprobs_in_every_spec_mode_are_the_target_alones_tiny(tiny_models, sampling):
    target = tiny_models["target"]
    slot = Engine(target, tiny_models["draft_close"], n_ctx=256).new_slot()
    drafted = 0
    for text in ("the cat sat on the mat", "hello world hello world hello"):
        prompt = target.tokenize(text)
        params = SamplingParams(max_tokens=40, ignore_eos=True, logprobs=5, **sampling)
        alone, alone_lps, _ = run(slot, prompt, params, SpecParams(mode="none"))
        assert_same_logprobs(reference_logprobs(target, prompt, alone, 5), alone_lps, TOL, f"{text!r} alone")
        if sampling.get("temperature") == 0.8:  # the tolerance tells distributions apart
            _, tempered, _ = run(slot, prompt, replace(params, logprobs_mode="processed"), SpecParams(mode="none"))
            assert max(abs(a.logprob - b.logprob) for a, b in zip(alone_lps, tempered)) > 10 * TOL
        for mode, k in MODES[1:]:
            tokens, lps, n = run(slot, prompt, params, SpecParams(mode=mode, draft_max=k))
            drafted += n
            assert_same_run(target, prompt, params, alone, alone_lps, tokens, lps, EPS_TINY, TOL, f"{mode} on {text!r}")
    slot.close()
    assert drafted > 50


def test_processed_logprobs_in_every_spec_mode_are_the_target_alones(tiny_models):
    target = tiny_models["target"]
    slot = Engine(target, tiny_models["draft_close"], n_ctx=256).new_slot()
    prompt = target.tokenize("hello world hello world hello")
    for sampling in (dict(), dict(temperature=0.9, top_k=8, seed=2)):
        params = SamplingParams(max_tokens=32, ignore_eos=True, logprobs=10, logprobs_mode="processed", **sampling)
        alone, alone_lps, _ = run(slot, prompt, params, SpecParams(mode="none"))
        assert all(len(t.top) <= (8 if sampling else 1) for t in alone_lps)  # only what could be drawn
        assert all(t.logprob <= 0 and t.id in dict(t.top) for t in alone_lps)
        for mode, k in MODES[1:]:
            tokens, lps, _ = run(slot, prompt, params, SpecParams(mode=mode, draft_max=k))
            assert_same_run(target, prompt, params, alone, alone_lps, tokens, lps, EPS_TINY, TOL, f"processed, {mode}")
    slot.close()


def test_tokens_cut_at_a_stop_string_or_max_tokens_get_no_logprobs(tiny_models):
    """Drafts run past where the text ends; only the committed tokens have logprobs, one each."""
    target = tiny_models["target"]
    slot = Engine(target, tiny_models["draft_close"], n_ctx=256).new_slot()
    prompt = target.tokenize("hello world hello world hello")
    free = slot.generate(prompt, SamplingParams(max_tokens=30, ignore_eos=True), SpecParams(mode="none"))
    stop = target.detokenize(free.tokens[10:12]).decode("utf-8", "replace")
    for params in (SamplingParams(max_tokens=30, ignore_eos=True, stop=(stop,), logprobs=2),
                   SamplingParams(max_tokens=7, ignore_eos=True, logprobs=2)):
        for mode in ("none", "draft", "ngram"):
            g = slot.generate(prompt, params, SpecParams(mode=mode, draft_max=8))
            tokens, lps, _ = run(slot, prompt, params, SpecParams(mode=mode, draft_max=8))
            assert tokens == g.tokens and len(lps) == len(tokens) < 30, (mode, params.stop)
    slot.close()


def test_eog_is_not_committed_and_gets_no_logprob(tiny_models):
    """A bias that makes the end-of-generation token the target's choice at once: nothing is committed."""
    target = tiny_models["target"]
    eos = target.tokenize("<|im_end|>", parse_special=True)[0]
    slot = Engine(target, tiny_models["draft_close"], n_ctx=256).new_slot()
    chunks = list(slot.stream(target.tokenize("the cat"),
                              SamplingParams(max_tokens=8, logit_bias={eos: 100}, logprobs=3),
                              SpecParams(mode="draft", draft_max=4)))
    assert all(not c.tokens and not c.logprobs for c in chunks)
    slot.close()


def test_no_logprobs_unless_asked(tiny_models):
    slot = Engine(tiny_models["target"], None, n_ctx=256).new_slot()
    chunks = list(slot.stream("the cat", SamplingParams(max_tokens=4, ignore_eos=True), SpecParams(mode="ngram")))
    assert chunks and all(c.logprobs is None for c in chunks)
    slot.close()


# --- the real models ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smol(real_model_paths):
    """The SmolLM2 pair: F16 target, Q4_1 draft."""
    from specserve.backends import load_model

    engine = Engine(load_model(str(real_model_paths["smollm2-f16"])), load_model(str(real_model_paths["smollm2-q4_1"])),
                    n_ctx=1024)
    yield engine
    engine.close()


@pytest.mark.parametrize("sampling", [dict(), dict(temperature=0.8, seed=3)])
def test_logprobs_in_every_spec_mode_are_the_target_alones_real_smollm2(smol, sampling):
    from specserve.prompt import prompt_tokens

    slot = smol.new_slot()
    prompt = prompt_tokens(smol.target, "List three uses of a hash map, each with one sentence.", chat=True)
    params = SamplingParams(max_tokens=32, logprobs=20, **sampling)
    alone, alone_lps, _ = run(slot, prompt, params, SpecParams(mode="none"))
    assert_same_logprobs(reference_logprobs(smol.target, prompt, alone, 20), alone_lps, TOL_F16, "alone")
    for mode, k in MODES[1:]:
        tokens, lps, _ = run(slot, prompt, params, SpecParams(mode=mode, draft_max=k))
        assert assert_same_run(smol.target, prompt, params, alone, alone_lps, tokens, lps, EPS_F16, TOL_F16, mode) > 8
    slot.close()


def test_forced_and_healed_tokens_get_the_targets_raw_logprob(smol):
    """A grammar's forced tokens (drafted free) and /infill's healed bytes are committed like any other:
    each gets the target's own logprob at its position, as the unconstrained target alone scores it."""
    from specserve.grammar import from_json_schema

    person = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "city": {"type": "string", "enum": ["Paris", "London", "Berlin"]}},
              "required": ["name", "city"], "additionalProperties": False}
    slot = smol.new_slot()
    cases = [(smol.target.tokenize("Extract as JSON: Anna lives in Berlin.\nJSON: "),
              SamplingParams(max_tokens=24, grammar=from_json_schema(person), logprobs=3)),
             (smol.target.tokenize("The most famous program prints Hello,", add_special=False),
              SamplingParams(max_tokens=12, heal=b" wor", logprobs=3))]
    for prompt, params in cases:
        alone, alone_lps, _ = run(slot, prompt, params, SpecParams(mode="none"))
        assert_same_logprobs(reference_logprobs(smol.target, prompt, alone, 3), alone_lps, TOL_F16, "alone")
        assert min(t.logprob for t in alone_lps) < np.log(0.5)  # the constraint chose against the model somewhere
        for mode in ("auto", "draft"):
            tokens, lps, drafted = run(slot, prompt, params, SpecParams(mode=mode, draft_max=6))
            assert tokens == alone and (drafted > 0 or mode == "auto"), mode  # as test_healing holds them
            assert_same_logprobs(alone_lps, lps, TOL_F16, mode)
    slot.close()


@pytest.mark.real_models
def test_logprobs_under_speculation_are_the_target_alones_qwen_reference_pair(qwen_pair):
    """The reference pair, a short prompt: the 0.5B draft and prompt lookup give the 1.5B's own logprobs."""
    from specserve.prompt import prompt_tokens

    target, draft = qwen_pair
    slot = Engine(target, draft, n_ctx=512).new_slot()
    prompt = prompt_tokens(target, "Write a Python function that returns the square of a number.", chat=True)
    for sampling in (dict(), dict(temperature=0.7, seed=1)):
        params = SamplingParams(max_tokens=32, logprobs=5, **sampling)
        alone, alone_lps, _ = run(slot, prompt, params, SpecParams(mode="none"))
        tokens, lps, drafted = run(slot, prompt, params, SpecParams(mode="draft", draft_max=6))
        assert drafted > 8
        same = assert_same_run(target, prompt, params, alone, alone_lps, tokens, lps, EPS_F16, TOL_F16, str(sampling))
        assert same > 8
    slot.close()
