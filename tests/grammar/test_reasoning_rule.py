"""A reasoning block's rule (grammar/reasoning.py) on a tiny reasoning model written by the suite: the budget
closes the block with its close tag forced, an output constraint starts after the block, and speculation
(draft model, lookups) gives the target alone's greedy text through all of it."""
from __future__ import annotations

import json

import numpy as np
import pytest

import tiny_models
from specserve.backends import load_model
from specserve.config import ReasoningBlock, SamplingParams, SpecParams
from specserve.engine import Engine
from specserve.grammar import Constraint, ReasoningRule, json_object
from specserve.prompt import chat_tokens


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    d = tmp_path_factory.mktemp("reasoning")
    kw = dict(seed=1, chat_template=tiny_models.QWEN3_THINKING_TEMPLATE,
              added_tokens=tiny_models.THINK_TAGS + tiny_models.TOOL_TAGS)
    target = tiny_models.write_tiny_model(d / "t.gguf", **kw)
    draft = tiny_models.write_tiny_model(d / "d.gguf", noise=0.05, noise_seed=7, **kw)
    e = Engine(load_model(str(target), n_threads=1), load_model(str(draft), n_threads=1), n_ctx=512)
    yield e
    e.close()


def _ids(engine: Engine, text: str) -> list[int]:
    return engine.target.tokenize(text, add_special=False, parse_special=True)


def _prompt(engine: Engine) -> list[int]:
    ids = chat_tokens(engine.target, [{"role": "user", "content": "the cat sat on the mat"}])
    assert ids[-2:] == _ids(engine, "<think>\n")  # the template opens the block: the answer starts inside it
    return ids


def _generate(engine: Engine, params: SamplingParams, mode: str):
    slot = engine.new_slot()
    try:
        return slot.generate(_prompt(engine), params, SpecParams(mode=mode, draft_max=4))
    finally:
        slot.close()


@pytest.mark.parametrize("budget", [0, 5, 11])
def test_the_budget_closes_the_block_with_its_tag_and_the_answer_goes_on(engine, budget):
    (close,) = _ids(engine, "</think>")
    params = SamplingParams(max_tokens=30, reasoning=ReasoningBlock(inside=True, budget=budget))
    gen = _generate(engine, params, "none")
    assert close not in gen.tokens[:budget] and gen.tokens[budget] == close, gen.tokens
    assert len(gen.tokens) == 30  # the answer went on after the forced close


def test_without_a_budget_the_block_is_the_models_own(engine):
    free = _generate(engine, SamplingParams(max_tokens=30), "none")
    ruled = _generate(engine, SamplingParams(max_tokens=30, reasoning=ReasoningBlock(inside=True)), "none")
    assert ruled.tokens == free.tokens  # no budget, no constraint: no rule at all


@pytest.mark.parametrize("budget", [-1, 0, 3, 9])
def test_speculation_gives_the_target_alones_text_inside_and_after_the_block(engine, budget):
    params = SamplingParams(max_tokens=40, reasoning=ReasoningBlock(inside=True, budget=budget))
    alone = _generate(engine, params, "none")
    for mode in ("draft", "ngram"):
        gen = _generate(engine, params, mode)
        assert gen.tokens == alone.tokens, mode
    assert _generate(engine, params, "draft").stats.n_accepted > 0  # speculation stayed on


def test_a_constraint_starts_after_the_block(engine):
    """json_object after a 6-token block: the answer past the close tag is JSON, the block is free, and
    the draft model's text equals the target alone's."""
    params = SamplingParams(max_tokens=60, grammar=json_object(),
                            reasoning=ReasoningBlock(inside=True, budget=6))
    alone = _generate(engine, params, "none")
    (close,) = _ids(engine, "</think>")
    assert alone.tokens[6] == close
    answer = engine.target.detokenize(alone.tokens[7:]).decode()
    assert answer.startswith("{")
    if alone.stats.finish_reason == "stop":
        json.loads(answer)
    assert _generate(engine, params, "draft").tokens == alone.tokens


def _rule(engine: Engine, budget: int, inner=None, inside: bool = False) -> ReasoningRule:
    return ReasoningRule(engine.target, ReasoningBlock(inside=inside, budget=budget), inner)


def test_a_block_the_model_opens_itself_is_counted_from_its_open_tag(engine):
    (open_,), (close,) = _ids(engine, "<think>"), _ids(engine, "</think>")
    words = _ids(engine, " the cat sat")
    rule = _rule(engine, budget=2)
    assert rule.state.phase == "start" and rule.forced(4) == []
    rule.commit([open_, *words[:2]])
    assert rule.state.phase == "force" and rule.forced(4) == [close]
    V = engine.target.vocab.n_vocab
    rows = rule.masked(np.zeros((3, V), np.float32), [close, words[0]])
    assert np.isfinite(rows[0]).sum() == 1 and np.isfinite(rows[0][close])  # row 0: the close tag only
    assert np.isfinite(rows[1]).all()  # after it, the answer: free (no inner constraint)
    assert rule.valid_prefix([close, *words]) == 1 + len(words) and rule.valid_prefix(words) == 0
    rule.commit([close])
    assert rule.state.phase == "answer" and rule.forced(4) == []


def test_an_answer_without_the_open_tag_has_no_block(engine):
    rule = _rule(engine, budget=0)
    rule.commit(_ids(engine, "Hello"))
    assert rule.state.phase == "answer" and rule.forced(4) == []


def test_rows_stop_where_a_draft_leaves_the_block_for_a_constrained_answer(engine):
    """Inside the block rows are free; the first row the inner grammar would judge is left for the
    next step (the target's token before it is the target alone's)."""
    (close,) = _ids(engine, "</think>")
    inner = Constraint(engine.grammar_tokenizer(), json_object())
    rule = _rule(engine, budget=-1, inner=inner, inside=True)
    words = _ids(engine, " the cat")
    V = engine.target.vocab.n_vocab
    draft = [*words, close, *_ids(engine, "{")]
    rows = rule.masked(np.zeros((len(draft) + 1, V), np.float32), draft)
    assert len(rows) == len(words) + 1 and np.isfinite(rows).all()  # up to the close tag's row, free
    rule.commit([*words, close])
    assert rule.state.phase == "answer"
    row = rule.masked(np.zeros((1, V), np.float32), [])[0]
    assert np.isfinite(row[_ids(engine, "{")[0]]) and not np.isfinite(row[words[0]])  # JSON from here


def test_the_open_tag_stays_allowed_before_a_constrained_answer(engine):
    """A model that opens the block itself, under a grammar: row 0 allows the grammar's tokens and the
    open tag; the grammar then starts after the block."""
    (open_,) = _ids(engine, "<think>")
    rule = _rule(engine, budget=1, inner=Constraint(engine.grammar_tokenizer(), json_object()))
    V = engine.target.vocab.n_vocab
    row = rule.masked(np.zeros((1, V), np.float32), [])[0]
    assert np.isfinite(row[open_]) and np.isfinite(row[_ids(engine, "{")[0]])
    assert not np.isfinite(row[_ids(engine, " the")[0]])


def _plain(engine: Engine, params: SamplingParams, mode: str = "none"):
    """A prompt that does not open the block: the answer (here, the grammar) may."""
    slot = engine.new_slot()
    try:
        return slot.generate(engine.target.tokenize("the cat sat on the mat", add_special=True), params,
                             SpecParams(mode=mode, draft_max=4))
    finally:
        slot.close()


@pytest.mark.parametrize("mode", ["none", "draft"])
def test_the_budget_holds_when_the_grammar_writes_the_block(engine, mode):
    """Issue 63: a grammar that wrote the thinking text itself (its open tag as text) was past the rule, which
    took its first token for the answer: the block ran on past the budget. Markers spelt in several tokens."""
    from specserve.grammar import from_gbnf

    grammar = from_gbnf('root ::= "[THINK]" [a-z ]+ "[/THINK]" " done"')
    params = SamplingParams(max_tokens=60, grammar=grammar, reasoning=ReasoningBlock("[THINK]", "[/THINK]", budget=4))
    gen = _plain(engine, params, mode)
    text = engine.target.detokenize(gen.tokens).decode()
    assert text.startswith("[THINK]") and text.endswith("[/THINK] done"), text
    inside = text[len("[THINK]"):text.index("[/THINK]")]
    assert 0 < len(_ids(engine, inside)) <= 4 + 1, inside  # (+1: a token may straddle the open tag's end)
    assert gen.tokens == _plain(engine, params, "none").tokens


def test_a_grammar_that_cannot_close_the_block_within_the_budget_is_a_dead_end(engine):
    from specserve.grammar import from_gbnf

    grammar = from_gbnf('root ::= "[THINK]" [a-z]{40} "[/THINK]"')
    params = SamplingParams(max_tokens=80, grammar=grammar, reasoning=ReasoningBlock("[THINK]", "[/THINK]", budget=3))
    gen = _plain(engine, params)
    assert "reasoning budget (3 tokens) is spent" in (gen.stats.grammar_error or ""), gen.stats.grammar_error
