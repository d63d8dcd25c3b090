"""Constraint sources: llguidance grammars from JSON Schema, Lark and GBNF, and clear refusals."""
from __future__ import annotations

import pytest

from specserve.engine import Engine
from specserve.grammar import GrammarError, from_gbnf, from_grammar_text, from_json_schema, from_lark, json_object


def test_sources_build_grammars():
    for g in (from_json_schema({"type": "object", "properties": {"a": {"type": "integer"}}}),
              from_json_schema('{"type": "array", "items": {"type": "boolean"}}'), json_object(),
              from_lark('start: "yes" | "no"'), from_gbnf('root ::= "yes" | "no"')):
        assert isinstance(g, str) and g


@pytest.mark.parametrize("bad, words", [
    ('{"type": "object",', "not valid JSON"),
    ("[1, 2]", "must be an object"),
    ({"type": "object", "if": {"type": "string"}, "then": {}}, '"if"'),  # unsupported keyword, named
    ({"type": "strnig"}, "strnig"),
])
def test_bad_json_schema_is_refused_with_its_reason(bad, words):
    with pytest.raises(GrammarError, match=words.replace("[", r"\[")) as e:
        from_json_schema(bad)
    assert isinstance(e.value, ValueError)


def test_bad_grammars_are_refused():
    with pytest.raises(GrammarError, match="Lark"):
        from_lark("start: ]]")
    with pytest.raises(GrammarError, match="GBNF"):
        from_gbnf('root ::= "unterminated')
    with pytest.raises(GrammarError, match="empty"):
        from_gbnf("  ")


def test_grammar_file_dispatch():
    assert from_grammar_text('%llguidance {}\nstart: "a"') == from_lark('%llguidance {}\nstart: "a"')
    assert from_grammar_text('start: "a"', "x.lark") == from_lark('start: "a"')
    assert from_grammar_text('root ::= "a"', "x.gbnf") == from_gbnf('root ::= "a"')


def test_check_grammar_against_the_target_vocabulary(tiny_models):
    engine = Engine(tiny_models["target"], n_ctx=64)
    engine.check_grammar(from_json_schema({"type": "object"}))  # no error
    with pytest.raises(GrammarError):
        engine.check_grammar("start: ]]")
