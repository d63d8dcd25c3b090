"""Fuzzing: any JSON Schema or GBNF grammar a client can send either compiles or is a GrammarError,
and a compiled one can be walked token by token without anything else going wrong.

The server's path in-process: the sources (with the limits), then compile_grammar on the worker's
threads, then the engine's Constraint over the tiny model's vocabulary, a few greedy steps under the
mask. A crash would take the test process down with it. About 20 s on 2 cores.
"""
from __future__ import annotations

import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specserve.grammar import CompiledGrammar, Constraint, GrammarError, GrammarWorker, compile_grammar, \
    from_gbnf, from_json_schema

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
_NAMES = st.text(string.ascii_lowercase + "_$#/", min_size=1, max_size=4)
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(string.printable, max_size=4))


def _leaf() -> st.SearchStrategy:
    return st.one_of(
        st.sampled_from([{"type": t} for t in ("string", "integer", "number", "boolean", "null", "object", "array")]),
        st.builds(lambda v: {"enum": v}, st.lists(_SCALARS, max_size=4)),
        st.builds(lambda v: {"const": v}, _SCALARS),
        st.builds(lambda a, b: {"type": "string", "minLength": a, "maxLength": b},
                  st.integers(0, 3), st.integers(0, 3)),
        st.builds(lambda a, b: {"type": "integer", "minimum": a, "maximum": b}, st.integers(-3, 3), st.integers(-3, 3)),
        st.builds(lambda p: {"type": "string", "pattern": p}, st.text("ab()|*+?[]^$.\\", max_size=6)),
        st.sampled_from([{"$ref": "#"}, {"$ref": "#/$defs/x"}, {"$ref": "#/nowhere"}, True, False, {}]),
    )


def _grow(children: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(
        st.builds(lambda props, req, extra: {"type": "object", "properties": props, "required": req,
                                             "additionalProperties": extra},
                  st.dictionaries(_NAMES, children, max_size=4), st.lists(_NAMES, max_size=3), st.booleans()),
        st.builds(lambda items, lo, hi: {"type": "array", "items": items, "minItems": lo, "maxItems": hi},
                  children, st.integers(0, 2), st.integers(0, 3)),
        st.builds(lambda key, alts: {key: alts}, st.sampled_from(["anyOf", "oneOf", "allOf"]),
                  st.lists(children, min_size=1, max_size=3)),
        st.builds(lambda body, x: {**body, "$defs": {"x": x}} if isinstance(body, dict) else body, children, children),
    )


SCHEMAS = st.recursive(_leaf(), _grow, max_leaves=12)

_ITEM = st.one_of(
    st.text(string.ascii_letters + string.digits + " {}\\n", max_size=3).map(lambda s: '"' + s.replace('"', "") + '"'),
    st.sampled_from(["[a-z]", "[^x]", "[0-9]", ".", "r0", "r1", "r2", "r3", "undefined"]),
)


def _sequence(items: st.SearchStrategy) -> st.SearchStrategy:
    return st.lists(items, min_size=1, max_size=3).map(" ".join)


def _expr() -> st.SearchStrategy:
    return st.recursive(_ITEM, lambda inner: st.one_of(
        st.builds(lambda s, q: f"({s}){q}", _sequence(inner), st.sampled_from(["", "*", "+", "?", "{1,2}"])),
        st.lists(_sequence(inner), min_size=2, max_size=3).map(" | ".join)), max_leaves=6)


GRAMMARS = st.lists(_sequence(_expr()), min_size=1, max_size=4).map(
    lambda bodies: "\n".join([f"root ::= {bodies[0]}", *(f"r{i} ::= {b}" for i, b in enumerate(bodies))]))


@pytest.fixture(scope="module")
def worker():
    w = GrammarWorker()
    yield w
    w.close()


def _walk(compiled: CompiledGrammar, tokenizer, steps: int = 12) -> None:
    """Greedy steps under the mask (the lowest allowed token each time), until done or a dead end."""
    c = Constraint(tokenizer, compiled)
    for _ in range(steps):
        if c.done or c.stuck():
            return
        allowed = [t for t in range(c.n_vocab) if c.valid_prefix([t])]
        assert allowed, "a state that is neither done nor stuck allows some token"
        c.commit([allowed[0]])


def _compile_or_refuse(worker, build, tokenizer) -> None:
    try:
        grammar = build()
    except GrammarError as e:
        assert str(e)
        return
    try:
        compiled = worker.submit(compile_grammar, grammar, tokenizer).result(timeout=60)
    except GrammarError as e:
        assert str(e)
        return
    _walk(compiled, tokenizer)


@FUZZ
@given(schema=SCHEMAS)
def test_any_schema_compiles_or_is_refused(worker, tiny_models, schema):
    _compile_or_refuse(worker, lambda: from_json_schema(schema, validate=False),
                       tiny_models["target"].grammar_tokenizer())


@FUZZ
@given(grammar=GRAMMARS)
def test_any_gbnf_grammar_compiles_or_is_refused(worker, tiny_models, grammar):
    _compile_or_refuse(worker, lambda: from_gbnf(grammar, validate=False), tiny_models["target"].grammar_tokenizer())
