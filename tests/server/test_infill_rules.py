"""/infill's pieces without HTTP: llama-server's line rules, response_fields, and the cache warm-up
that leaves both models' caches holding the prompt, so a keystroke evaluates only its new tokens."""
from __future__ import annotations

import time

import pytest

from specserve import steps
from specserve.config import SamplingParams, SpecParams
from specserve.drafters.draft_model import DraftModelDrafter
from specserve.engine import Engine
from specserve.server.apis.llama.infill_rules import LineRules, select_fields
from specserve.stats import GenerationStats


def pushed(rules: LineRules, chunks: list[str]) -> str:
    out = []
    for c in chunks:
        out.append(rules.push(c))
        if rules.stopped:
            break
    return "".join(out)


@pytest.mark.parametrize("chunks, n_indent, expect, stopped", [
    # the first line indented less than 4 is cut after its indentation, as llama-server cuts it
    (["x = 1\n", "    y = 2\n", "z = 3\n"], 4, "x = 1\n    y = 2\n", True),
    (["x = 1\n    y", " = 2\n  z = 3\n"], 4, "x = 1\n    y = 2\n  ", True),
    # one chunk of several lines (a speculative step) is cut at the same place
    (["x = 1\n    y = 2\n  z = 3\n    w\n"], 4, "x = 1\n    y = 2\n  ", True),
    # an empty line is a line indented less (llama-server's rule)
    (["a\n", "\n", "    b\n"], 4, "a\n", True),
    # a tab counts as one character of indentation
    (["a\n\tb\n"], 1, "a\n\tb\n", False),
    # the indentation is judged once the line has a character that is not blank
    (["a\n  ", "  b"], 4, "a\n    b", False),
    (["a\n  ", "b"], 4, "a\n  ", True),
    (["no newline at all"], 4, "no newline at all", False),
    (["a\nb\n"], 0, "a\nb\n", False),  # 0: off
])
def test_n_indent(chunks, n_indent, expect, stopped):
    rules = LineRules(n_indent=n_indent)
    assert pushed(rules, chunks) == expect
    assert rules.stopped is stopped


def test_t_max_predict_ms_stops_at_a_newline_once_the_time_is_up():
    rules = LineRules(t_max_predict_ms=50, t_start=time.perf_counter())
    assert rules.push("a\n") == "a\n" and not rules.stopped  # in time
    assert rules.push("b") == "b"
    time.sleep(0.06)
    assert rules.push("c") == "c" and not rules.stopped  # past the time but no newline yet
    assert rules.push("d\ne\nf") == "d\n" and rules.stopped  # the chunk is cut after its first newline
    assert rules.text == "a\nbcd\n"


def test_response_fields_are_picked_by_path():
    answer = {"content": "x", "timings": {"prompt_n": 3, "predicted_n": 2}, "truncated": False}
    assert select_fields(answer, ["content", "timings/prompt_n", "truncated", "tokens_cached", "timings/none"]) == \
        {"content": "x", "timings/prompt_n": 3, "truncated": False}
    assert select_fields(answer, [""]) == {}  # llama.vim's warm-up asks for nothing


def test_warm_up_fills_both_caches_and_a_keystroke_then_evaluates_only_new_tokens(tiny_models):
    engine = Engine(tiny_models["target"], tiny_models["draft_close"], n_ctx=256)
    slot = engine.new_slot()
    try:
        tokens = engine.target.tokenize("the cat sat on the mat and the dog ran", add_special=False)
        stats = GenerationStats()
        steps.direct(slot.warm_steps(tokens, stats))
        assert slot.ctx.tokens == tokens[:-1] and slot.draft_ctx.tokens == tokens[:-1]
        assert (stats.n_prompt, stats.n_cached, stats.finish_reason) == (len(tokens), 0, "length")
        # the keystroke: the same prompt and a few more tokens, generated with the draft model
        more = tokens + engine.target.tokenize(" in the", add_special=False)
        drafter = DraftModelDrafter(engine.draft, slot.draft_ctx)
        assert drafter.missing(more) == len(more) - len(tokens)  # the draft model lacks only the new tokens
        gen = slot.generate(more, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
                            SpecParams(mode="draft"))
        assert gen.stats.n_cached == len(tokens) - 1  # the target evaluated only the new ones
        assert gen.stats.n_drafted > 0
        # and the warm-up of a prompt already there evaluates nothing
        again = GenerationStats()
        steps.direct(slot.warm_steps(more, again))
        assert again.n_cached == len(more) - 1
    finally:
        slot.close()
