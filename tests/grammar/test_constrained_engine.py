"""Constrained generation with speculation on: the same text as the constrained target alone,
valid output, forced tokens accepted, and a dead end stated."""
from __future__ import annotations

import json

import jsonschema
import pytest

from specserve.config import SamplingParams, SpecParams
from specserve.engine import Engine
from specserve.grammar import Constraint, from_json_schema, from_lark
from constrained_checks import PERSON, assert_constrained_greedy_equal, smol  # noqa: F401 (a fixture)

PROMPTS = ["Extract as JSON: Anna is 31, lives in Berlin and likes chess and tea.\nJSON: ",
           "Bob (44) moved to Paris last year.\nAs JSON: "]


def test_greedy_constrained_text_is_the_target_alones_in_every_mode(smol):
    grammar = from_json_schema(PERSON)
    slot = smol.new_slot()
    for text in PROMPTS[:1]:  # seconds on a quiet machine; the bench's structured workload covers more
        prompt = smol.target.tokenize(text)
        params = SamplingParams(max_tokens=80, grammar=grammar)
        alone = slot.generate(prompt, params, SpecParams(mode="none"))
        assert alone.stats.finish_reason == "stop"
        jsonschema.validate(json.loads(alone.text), PERSON)
        for mode in ("draft", "ngram", "suffix", "auto"):
            g = slot.generate(prompt, params, SpecParams(mode=mode))
            assert_constrained_greedy_equal(smol, grammar, prompt, alone.tokens, g.tokens, mode)
            assert g.stats.t_grammar > 0 and g.stats.grammar_error is None
            if mode == "draft":
                assert g.stats.n_accepted > 0
    slot.close()


@pytest.mark.parametrize("mode", ["draft", "ngram"])
def test_gumbel_same_seed_same_text_constrained(smol, mode):
    grammar = from_json_schema(PERSON)
    slot = smol.new_slot()
    for seed in range(2):
        params = SamplingParams(max_tokens=60, temperature=0.9, seed=seed, grammar=grammar)
        alone = slot.generate(PROMPTS[0], params, SpecParams(mode="none"), "gumbel")
        spec = slot.generate(PROMPTS[0], params, SpecParams(mode=mode), "gumbel")
        assert spec.text == alone.text
    slot.close()


def test_forced_tokens_are_drafted_and_all_accepted(smol):
    """A grammar that is one literal: everything is forced, proposed by the forced drafter alone
    (mode ngram has no match in this prompt) and accepted."""
    literal = '{"status": "ok", "items": [1, 2, 3], "done": true}'
    grammar = from_lark(f"start: {json.dumps(literal)}")
    c = Constraint(smol.grammar_tokenizer(), grammar)
    forced = c.forced(64)
    assert forced and smol.target.detokenize(forced).decode() == literal[:len(smol.target.detokenize(forced))]
    g = smol.new_slot().generate("Say something.", SamplingParams(max_tokens=64, grammar=grammar),
                                 SpecParams(mode="ngram", draft_max=8))
    assert g.text == literal and g.stats.finish_reason == "stop"
    # every pass but its own token was forced tokens, all accepted
    assert g.stats.n_accepted == g.stats.n_drafted >= len(g.tokens) - g.stats.n_passes > 0


def test_a_dead_end_ends_with_a_reason(tiny_models):
    """A grammar that can never end ("c" forever): llguidance gives up on it after "a"; the request
    stops there and says why, in one line."""
    lark, reason = 'start: "ab" x\nx: "c" x', "grammar error: "
    engine = Engine(tiny_models["target"], tiny_models["draft_close"], n_ctx=128)
    for mode in ("none", "draft"):
        g = engine.new_slot().generate("hello", SamplingParams(max_tokens=20, grammar=from_lark(lark)),
                                       SpecParams(mode=mode))
        assert g.stats.finish_reason == "stop"
        assert reason in g.stats.grammar_error and "\n" not in g.stats.grammar_error
        assert "ab".startswith(g.text)


def test_complete_grammar_stops(tiny_models):
    engine = Engine(tiny_models["target"], tiny_models["draft_close"], n_ctx=128)
    for mode in ("none", "draft"):
        g = engine.new_slot().generate("hello", SamplingParams(max_tokens=30, grammar=from_lark('start: "yes" | "no"')),
                                       SpecParams(mode=mode))
        assert g.text in ("yes", "no") and g.stats.finish_reason == "stop"


def test_auto_always_takes_the_forced_run(smol):
    """Under --spec auto, every step where the grammar forces tokens drafts at least them (a plan
    "off" included: the forced run alone), from a fresh controller's first step on; and the text
    is the constrained target alone's."""
    grammar = from_json_schema(PERSON)
    engine = Engine(smol.target, smol.draft, n_ctx=1024)  # a fresh controller; the models stay smol's
    slot = engine.new_slot()
    prompt = smol.target.tokenize(PROMPTS[1])
    params = SamplingParams(max_tokens=80, grammar=grammar)
    alone = slot.generate(prompt, params, SpecParams(mode="none"))
    c, tokens, steps_forced = Constraint(engine.grammar_tokenizer(), grammar), [], 0
    for chunk in slot.stream(prompt, params, SpecParams(mode="auto")):
        forced = c.forced(min(64, params.max_tokens - len(tokens) - 1))
        if forced and chunk.tokens[:len(forced)] == forced:  # it ran on (a finish can cut a step short)
            steps_forced += 1
            assert chunk.n_drafted >= len(forced), f"step at token {len(tokens)}: forced {len(forced)}, " \
                                                   f"drafted and kept {chunk.n_drafted} ({chunk.drafter})"
        c.commit(chunk.tokens)
        tokens += chunk.tokens
    assert steps_forced >= 3
    assert_constrained_greedy_equal(smol, grammar, prompt, alone.tokens, tokens, "auto")
    slot.close()
