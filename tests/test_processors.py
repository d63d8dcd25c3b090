"""logit_bias and the repetition penalties: llama.cpp's arithmetic, each verified row under its own
history, and speculation as lossless under them as without them."""
from __future__ import annotations

import math

import numpy as np
import pytest

from equality import assert_same_sampled_text
from specserve.config import SamplingParams, SpecParams
from specserve.engine import Engine
from specserve.processors import LogitRules

EPS = 0.02  # a divergence only at a near-tie of the target's processed scores (equality.py; tiny models ~3e-3)

# llama_sampler_penalties_apply, by hand: (logit, count in the window, repeat, frequency, presence, expected)
PENALTY_TABLE = [
    (2.0, 1, 2.0, 0.0, 0.0, 1.0),  # a positive logit is divided
    (-2.0, 1, 2.0, 0.0, 0.0, -4.0),  # a negative one multiplied (the "negative logit fix")
    (0.0, 3, 2.0, 0.5, 0.25, -1.75),  # zero counts as negative; then count * frequency + presence
    (3.0, 2, 1.0, 0.5, 1.0, 1.0),  # OpenAI's formula alone: 3 - 2 * 0.5 - 1
    (1.0, 1, 1.0, 0.0, -0.5, 1.5),  # a negative presence penalty encourages
    (3.0, 0, 2.0, 0.5, 1.0, 3.0),  # not in the window: untouched
    (-math.inf, 2, 1.5, 0.5, 0.5, -math.inf),  # forbidden stays forbidden
]


@pytest.mark.parametrize("logit, count, repeat, frequency, presence, expected", PENALTY_TABLE)
def test_penalty_arithmetic_is_llama_cpps(logit, count, repeat, frequency, presence, expected):
    params = SamplingParams(repeat_penalty=repeat, frequency_penalty=frequency, presence_penalty=presence,
                            repeat_last_n=8)
    logits = np.array([logit, 5.0], np.float32)  # token 1 never occurs: unchanged
    out = LogitRules(params).apply(logits, [0] * count + [2] * (8 - count))
    assert out.tolist() == [expected, 5.0]


def test_the_window_is_the_last_repeat_last_n_tokens_of_prompt_and_output():
    history = [3, 3, 1, 2, 2, 2]
    for last_n, counts in ((3, {2: 3}), (5, {3: 1, 1: 1, 2: 3}), (-1, {3: 2, 1: 1, 2: 3}), (100, {3: 2, 1: 1, 2: 3})):
        rules = LogitRules(SamplingParams(frequency_penalty=1.0, repeat_last_n=last_n))
        out = rules.apply(np.zeros(5, np.float32), history)
        assert out.tolist() == [-counts.get(t, 0) for t in range(5)], last_n
    assert LogitRules.of(SamplingParams(repeat_penalty=1.5, repeat_last_n=0)) is None  # llama.cpp: 0 = off
    assert LogitRules.of(SamplingParams()) is None and LogitRules.of(SamplingParams(presence_penalty=0.1))


def test_each_row_is_penalized_under_its_own_draft_prefix():
    """One call over a verification pass's rows equals one call per row with that row's history."""
    rng = np.random.default_rng(0)
    for last_n in (1, 4, 7, 64, -1):
        rules = LogitRules(SamplingParams(repeat_penalty=1.7, frequency_penalty=0.3, presence_penalty=0.2,
                                          repeat_last_n=last_n, logit_bias={2: 1.5, 9: -math.inf}))
        for _ in range(20):
            history = rng.integers(0, 12, rng.integers(0, 10)).tolist()
            draft = rng.integers(0, 12, rng.integers(0, 8)).tolist()
            logits = rng.normal(0, 3, (len(draft) + 1, 12)).astype(np.float32)
            rows = rules.apply(logits, history, draft)
            for i in range(len(draft) + 1):
                assert rows[i].tolist() == rules.apply(logits[i], history + draft[:i]).tolist(), (last_n, i)
    assert np.isneginf(rows[:, 9]).all()


def test_logit_bias_adds_and_skips_tokens_a_smaller_vocabulary_lacks():
    rules = LogitRules(SamplingParams(logit_bias=[(1, 2.0), (1, 0.5), (7, -math.inf), (50, 3.0)]))
    assert rules.apply(np.zeros(8, np.float32), []).tolist() == [0, 2.5, 0, 0, 0, 0, 0, -math.inf]
    with pytest.raises(ValueError, match="logit_bias names token 50"):
        LogitRules.check(SamplingParams(logit_bias={50: 1.0}), 50)


@pytest.mark.parametrize("kw, message", [
    (dict(logit_bias={"a": 1.0}), "logit_bias token ids must be integers"),
    (dict(logit_bias={-1: 1.0}), "logit_bias token ids must be integers"),
    (dict(logit_bias={1: math.nan}), "logit_bias values must be numbers"),
    (dict(logit_bias={1: 1e308}), "logit_bias values must be numbers from"),  # float32 inf: refused, not rounded
    (dict(logit_bias={1: -1e300}), "logit_bias values must be numbers from"),
    (dict(logit_bias=[(1, 1e30), (1, 1e30)]), "logit_bias adds up to 2e\\+30 on token 1"),
    (dict(logit_bias=[(1, math.inf), (1, -math.inf)]), "both forbids .* and forces"),
    (dict(repeat_penalty=1e-300), "repeat_penalty must be"),  # float32 0: a division by zero
    (dict(frequency_penalty=-1e300), "frequency_penalty must be"),
    (dict(logit_bias=[[1, 2, 3]]), "logit_bias must map token ids to numbers"),
    (dict(logit_bias=5), "logit_bias must map token ids to numbers"),
    (dict(repeat_penalty=0.0), "repeat_penalty must be"),
    (dict(repeat_penalty=math.inf), "repeat_penalty must be"),
    (dict(repeat_last_n=-2), "repeat_last_n must be >= -1"),
    (dict(presence_penalty=math.nan), "presence_penalty must be"),
    (dict(frequency_penalty=-math.inf), "frequency_penalty must be"),
    (dict(logprobs=21), "logprobs must be in"),
    (dict(logprobs=True), "logprobs must be in"),
    (dict(logprobs_mode="softmax"), "logprobs_mode must be one of"),
])
def test_bad_values_are_refused_naming_the_field(kw, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kw)


def test_an_infinite_bias_forces_its_tokens_and_nothing_else_is_drawn():
    """Issue 63 N3: +inf (as llama-server takes it) made the logits inf and the request a 500."""
    rules = LogitRules(SamplingParams(logit_bias={2: math.inf, 5: math.inf, 3: 1.0}))
    out = rules.apply(np.arange(8, dtype=np.float32), [])
    assert out.tolist() == [-math.inf, -math.inf, 2, -math.inf, -math.inf, 5, -math.inf, -math.inf]


def test_a_bias_that_forbids_every_token_is_refused_before_generation():
    """Issue 63 N3: false on every token left no finite logit (500 NonFiniteLogits)."""
    with pytest.raises(ValueError, match="forbids every one of the model's 8 tokens"):
        LogitRules.check(SamplingParams(logit_bias={t: -math.inf for t in range(8)}), 8)
    LogitRules.check(SamplingParams(logit_bias={t: -math.inf for t in range(7)}), 8)  # one left: fine


def test_logit_bias_takes_a_mapping_or_pairs():
    assert SamplingParams(logit_bias={5: -100, 2: 1}).logit_bias == ((2, 1.0), (5, -100.0))
    assert SamplingParams(logit_bias=[[5, 1], [5, 2.5], (2, -math.inf)]).logit_bias == ((2, -math.inf), (5, 3.5))


# --- the engine ---------------------------------------------------------------------------------------

SAMPLINGS = [dict(), dict(temperature=0.8, seed=4)]
MODES = [("draft", 4), ("ngram", 6), ("suffix", 8), ("auto", 8)]


def modes_agree(target, slot, prompt, params) -> tuple[list[int], int, int]:
    """The target alone's tokens, after checking every spec mode gives them; and what the draft model
    drafted and had accepted."""
    alone = slot.generate(prompt, params, SpecParams(mode="none")).tokens
    drafted = accepted = 0
    for mode, k in MODES:
        g = slot.generate(prompt, params, SpecParams(mode=mode, draft_max=k))
        assert_same_sampled_text(target, prompt, params, alone, g.tokens, EPS, f"{mode}, {params}")
        if mode == "draft":
            drafted, accepted = g.stats.n_drafted, g.stats.n_accepted
    return alone, drafted, accepted


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_a_forbidden_token_never_comes_and_speculation_gives_the_same_text(tiny_models, sampling):
    target = tiny_models["target"]
    slot = Engine(target, tiny_models["draft_close"], n_ctx=256).new_slot()
    prompt = target.tokenize("hello world hello world hello")
    free = slot.generate(prompt, SamplingParams(max_tokens=40, ignore_eos=True, **sampling), SpecParams(mode="none"))
    banned = max(set(free.tokens), key=free.tokens.count)  # what the target says most
    for bias in (-math.inf, -100.0):
        params = SamplingParams(max_tokens=40, ignore_eos=True, logit_bias={banned: bias}, **sampling)
        alone, _, _ = modes_agree(target, slot, prompt, params)
        assert banned not in alone and alone != free.tokens
    slot.close()


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_a_large_positive_bias_forces_a_token_and_the_draft_model_drafts_it(tiny_models, sampling):
    """The draft model drafts under the same bias: its drafts of the forced token are accepted."""
    target = tiny_models["target"]
    slot = Engine(target, tiny_models["draft_far"], n_ctx=256).new_slot()  # an unrelated draft: only the bias agrees
    forced = target.tokenize(" the")[0]
    params = SamplingParams(max_tokens=24, ignore_eos=True, logit_bias={forced: 100}, **sampling)
    alone, drafted, accepted = modes_agree(target, slot, target.tokenize("the cat sat"), params)
    assert alone == [forced] * 24
    assert drafted >= 8 and accepted == drafted
    slot.close()


PENALTIES = [dict(repeat_penalty=1.5), dict(frequency_penalty=1.5, presence_penalty=1.0, repeat_last_n=16),
             dict(repeat_penalty=1.2, presence_penalty=0.5, repeat_last_n=-1)]


@pytest.mark.parametrize("penalties", PENALTIES)
@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_penalized_text_is_the_same_with_and_without_speculation(tiny_models, penalties, sampling):
    target = tiny_models["target"]
    slot = Engine(target, tiny_models["draft_close"], n_ctx=256).new_slot()
    prompt = target.tokenize("hello world hello world hello")
    plain = slot.generate(prompt, SamplingParams(max_tokens=48, ignore_eos=True, **sampling), SpecParams(mode="none"))
    params = SamplingParams(max_tokens=48, ignore_eos=True, **penalties, **sampling)
    alone, drafted, accepted = modes_agree(target, slot, prompt, params)
    assert alone != plain.tokens  # the penalties did something
    assert accepted > drafted / 2  # the draft model drafts under them too
    slot.close()


def test_greedy_penalties_follow_llama_cpps_sampler_one_token_at_a_time(tiny_models):
    """An independent loop: the target alone one token a pass, llama.cpp's penalties over a ring of the
    last n tokens the sampler accepted (the prompt's included), argmax."""
    target = tiny_models["target"]
    prompt = target.tokenize("hello world hello world hello")
    rp, freq, pres, last_n = 1.3, 0.4, 0.3, 8
    ctx = target.new_context(256)
    out, row = [], ctx.eval(prompt)[0].copy()
    for _ in range(40):
        ring = (prompt + out)[-last_n:]
        for t in set(ring):
            c = ring.count(t)
            row[t] = row[t] * np.float32(rp) if row[t] <= 0 else row[t] / np.float32(rp)
            row[t] -= np.float32(c * freq + pres)
        out.append(int(np.argmax(row)))
        row = ctx.eval([out[-1]])[0].copy()
    ctx.close()
    slot = Engine(target, tiny_models["draft_close"], n_ctx=256).new_slot()
    params = SamplingParams(max_tokens=40, ignore_eos=True, repeat_penalty=rp, frequency_penalty=freq,
                            presence_penalty=pres, repeat_last_n=last_n)
    for mode in ("none", "draft"):
        g = slot.generate(prompt, params, SpecParams(mode=mode, draft_max=4))
        assert_same_sampled_text(target, prompt, params, out, g.tokens, EPS, mode)
    slot.close()


def test_penalties_with_speculation_on_the_real_smollm2_pair(real_model_paths):
    from specserve.backends import load_model
    from specserve.prompt import prompt_tokens

    target = load_model(str(real_model_paths["smollm2-f16"]))
    engine = Engine(target, load_model(str(real_model_paths["smollm2-q4_1"])), n_ctx=1024)
    slot = engine.new_slot()
    prompt = prompt_tokens(target, "List three uses of a hash map, each with one sentence.", chat=True)
    for sampling in SAMPLINGS:
        params = SamplingParams(max_tokens=40, repeat_penalty=1.15, presence_penalty=0.3, **sampling)
        alone = slot.generate(prompt, params, SpecParams(mode="none")).tokens
        g = slot.generate(prompt, params, SpecParams(mode="draft", draft_max=6))
        assert g.stats.n_accepted > 8
        assert_same_sampled_text(target, prompt, params, alone, g.tokens, 0.02, f"draft, {sampling}")
    slot.close()
    engine.close()
