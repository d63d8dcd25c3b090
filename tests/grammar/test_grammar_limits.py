"""Schemas and grammars past the limits are refused before llguidance sees them; what the limits let
through compiles once, on the worker's large stack, and the engine copies it instead of compiling again."""
from __future__ import annotations

import threading

import llguidance
import pytest

from specserve.config import SamplingParams
from specserve.grammar import CompiledGrammar, Constraint, GrammarError, GrammarWorker, compile_grammar, \
    for_request, from_gbnf, from_json_schema, from_lark
from specserve.grammar import limits


def chain_gbnf(n: int) -> str:
    return "\n".join(["root ::= r0", *(f'r{i} ::= "x{i}" | r{i + 1}' for i in range(n)), f'r{n} ::= "end"'])


def props(n: int, required: bool = False) -> dict:
    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)}}
    return {**schema, "required": list(schema["properties"])} if required else schema


def ref_chain(n: int) -> dict:
    defs = {f"d{i}": {"anyOf": [{"type": "integer"}, {"$ref": f"#/$defs/d{i + 1}"}]} for i in range(n)}
    return {"$ref": "#/$defs/d0", "$defs": {**defs, f"d{n}": {"type": "string"}}}


def nested(n: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(n):
        schema = {"type": "array", "items": schema}
    return schema


@pytest.mark.parametrize("source, limit", [
    (lambda: from_gbnf(chain_gbnf(5000)), "bytes of grammar text"),  # the GBNF that killed the server
    (lambda: from_gbnf(chain_gbnf(1200)), "rules in a grammar"),
    (lambda: from_gbnf(chain_gbnf(1200).replace("\n", "\r")), "rules in a grammar"),  # \r alone ends a line too
    (lambda: from_gbnf("root ::= " + " | ".join(f'"w{i}"' for i in range(50_000))), "bytes of grammar text"),
    (lambda: from_lark("start: R0\n" + "\n".join(f'R{i}: "x" | R{i + 1}' for i in range(1200)) + '\nR1200: "y"\n'),
     "rules in a grammar"),
    (lambda: from_json_schema(props(10_000)), "properties of one object"),
    (lambda: from_json_schema(props(15_000)), "properties of one object"),
    (lambda: from_json_schema({"type": "object", "properties": {f"o{j}": props(900) for j in range(6)}}),
     "properties in a schema"),
    (lambda: from_json_schema(ref_chain(1500)), "$refs in a schema"),
    (lambda: from_json_schema(nested(100)), "levels of nesting"),
    (lambda: from_json_schema({"enum": list(range(60_000))}), "values in a schema"),
])
def test_a_source_past_a_limit_is_refused_naming_the_limit(source, limit):
    with pytest.raises(GrammarError, match=f"over the limit of [0-9,]+ \\({limit.replace('$', '.')}\\)"):
        source()


def test_a_schema_too_deep_for_python_s_recursion_is_refused_not_a_crash():
    with pytest.raises(GrammarError, match="levels of nesting"):
        from_json_schema(nested(5000))


def test_sources_at_the_limits_pass(tiny_models):
    tokenizer = tiny_models["target"].grammar_tokenizer()
    worker = GrammarWorker()
    try:
        for grammar in (from_gbnf(chain_gbnf(limits.MAX_GRAMMAR_RULES - 2), validate=False),
                        from_json_schema(props(limits.MAX_OBJECT_PROPERTIES), validate=False),
                        from_json_schema(ref_chain(limits.MAX_REFS - 1), validate=False)):
            compiled = worker.submit(compile_grammar, grammar, tokenizer).result(timeout=120)
            assert isinstance(compiled, CompiledGrammar) and compiled == grammar
    finally:
        worker.close()


def test_the_worker_compiles_what_would_overflow_a_default_thread_s_stack(tiny_models):
    """3,600 chained lexeme rules overflow the 8 MiB stack of a default thread (SIGSEGV); the limits
    refuse such a grammar, and the worker's stack holds it even so, with 10x to spare."""
    lark = "start: R0\n" + "\n".join(f'R{i}: "x{i}" | R{i + 1}' for i in range(5000)) + '\nR5000: "end"\n'
    worker = GrammarWorker()
    try:
        future = worker.submit(compile_grammar, lark, tiny_models["target"].grammar_tokenizer())
        with pytest.raises(GrammarError, match="too big"):  # llguidance's own lexer limit, not a crash
            future.result(timeout=120)
        assert future.exception() is not None
        names = [t.name for t in threading.enumerate()]
        assert "grammar-0" in names
    finally:
        worker.close()


@pytest.mark.parametrize("schema", [
    {"$ref": "#"},
    {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
])
def test_a_schema_with_no_output_is_refused_when_compiled(tiny_models, schema):
    with pytest.raises(GrammarError, match="allows no output"):
        compile_grammar(from_json_schema(schema, validate=False), tiny_models["target"].grammar_tokenizer())


def test_json_schema_true_is_any_json_and_false_is_refused(tiny_models):
    tokenizer = tiny_models["target"].grammar_tokenizer()
    assert compile_grammar(from_json_schema(True, validate=False), tokenizer) == from_json_schema({})
    with pytest.raises(GrammarError, match="allows no value"):
        from_json_schema(False)


def test_the_engine_copies_the_compiled_matcher_instead_of_compiling(tiny_models, monkeypatch):
    model = tiny_models["target"]
    compiled = compile_grammar(from_json_schema({"type": "object"}, validate=False), model.grammar_tokenizer())
    monkeypatch.setattr(llguidance, "LLMatcher", None)  # any compile from here on would raise
    params = SamplingParams(grammar=compiled)
    first = for_request(params, model.grammar_tokenizer, model)
    second = for_request(params, model.grammar_tokenizer, model)
    assert isinstance(first, Constraint) and first.matcher is not second.matcher
    first.commit(first.forced(1) or [model.tokenize("{", add_special=False)[0]])
    assert first.n_committed == 1 and second.n_committed == 0
    assert not second.stuck() and second.matcher.is_accepting() is False  # the copy is at the start state
