"""Sampling under a grammar: the tokens follow the target's masked distribution (chi-square, as
test_lossless does unconstrained), and outputs validate over many generated schemas (hypothesis)."""
from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specserve.config import SamplingParams, SpecParams
from specserve.engine import Engine
from specserve.grammar import Constraint, from_json_schema, from_lark
from specserve.sampling import process
from lossless_checks import chi_square_pvalue

N_RUNS = 2000
LETTERS = from_lark("start: /[a-e]{12}/")  # 12 letters: two tokens never complete it


def exact_first_two_masked(engine: Engine, prompt: list[int], params: SamplingParams) -> dict:
    """P(t1, t2) under the target alone with the grammar's mask, one token at a time."""
    c = Constraint(engine.grammar_tokenizer(), params.grammar)
    ctx = engine.target.new_context(256)
    try:
        with c.ahead() as walk:
            p1 = process(walk.mask(ctx.eval(prompt)[0].copy()), params)
        joint = {}
        for t1 in np.flatnonzero(p1):
            ctx.truncate(len(prompt))
            row = ctx.eval([int(t1)])[0].copy()
            with c.ahead() as walk:
                assert walk.advance(int(t1))
                p2 = process(walk.mask(row), params)
            for t2 in np.flatnonzero(p2):
                joint[(int(t1), int(t2))] = p1[t1] * p2[t2]
        return joint
    finally:
        ctx.close()


@pytest.mark.parametrize("method, sampling", [("rejection", dict(temperature=1.0)),
                                              ("gumbel", dict(temperature=1.5, top_p=0.9))])
def test_sampled_tokens_follow_the_masked_target_distribution(tiny_models, method, sampling):
    engine = Engine(tiny_models["target"], tiny_models["draft_close"], n_ctx=256)
    prompt = engine.target.tokenize("the cat sat on the mat")
    expected = exact_first_two_masked(engine, prompt, SamplingParams(grammar=LETTERS, **sampling))
    slot = engine.new_slot()
    counts: dict = {}
    drafted = accepted = 0
    for seed in range(N_RUNS):
        params = SamplingParams(max_tokens=3, seed=seed, grammar=LETTERS, **sampling)
        g = slot.generate(prompt, params, SpecParams(mode="draft", draft_max=2), method)
        key = (g.tokens[0], g.tokens[1])
        counts[key] = counts.get(key, 0) + 1
        drafted += g.stats.n_drafted
        accepted += g.stats.n_accepted
    slot.close()
    assert all(set(engine.target.detokenize(k).decode()) <= set("abcde") for k in counts)
    assert 0 < accepted < drafted
    p = chi_square_pvalue(counts, expected, N_RUNS)
    assert p > 1e-3, f"distribution differs from the masked target's (chi-square p = {p:.2e})"


# --- outputs validate over generated schemas -----------------------------------------------------

_LEAF = st.one_of(
    st.just({"type": "boolean"}),
    st.integers(-50, 50).flatmap(lambda lo: st.integers(lo, lo + 100).map(
        lambda hi: {"type": "integer", "minimum": lo, "maximum": hi})),
    st.lists(st.sampled_from(["red", "green", "blue", "x", "yes"]), min_size=1, max_size=4, unique=True).map(
        lambda e: {"type": "string", "enum": e}),
    st.integers(0, 6).map(lambda n: {"type": "string", "maxLength": n}),
    st.just({"type": "null"}),
)
_VALUE = st.recursive(_LEAF, lambda inner: st.one_of(
    st.lists(inner, min_size=1, max_size=2).map(lambda xs: {"type": "array", "items": xs[0], "maxItems": 2}),
    st.dictionaries(st.sampled_from(["a", "b", "id", "name"]), inner, min_size=1, max_size=2).map(
        lambda props: {"type": "object", "properties": props, "required": sorted(props),
                       "additionalProperties": False}),
), max_leaves=4)
SCHEMAS = st.dictionaries(st.sampled_from(["k", "v", "n", "ok"]), _VALUE, min_size=1, max_size=3).map(
    lambda props: {"type": "object", "properties": props, "required": sorted(props), "additionalProperties": False})


@pytest.fixture(scope="module")
def tiny_engine(tiny_models):
    return Engine(tiny_models["target"], tiny_models["draft_close"], n_ctx=256)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schema=SCHEMAS, seed=st.integers(0, 2**32), mode=st.sampled_from(["draft", "ngram", "auto"]))
def test_outputs_validate_over_generated_schemas(tiny_engine, schema, seed, mode):
    params = SamplingParams(max_tokens=96, temperature=0.8, seed=seed, grammar=from_json_schema(schema))
    g = tiny_engine.new_slot().generate("data:", params, SpecParams(mode=mode))
    assert g.stats.grammar_error is None
    if g.stats.finish_reason == "stop":
        jsonschema.validate(json.loads(g.text), schema)
    else:  # cut by max_tokens: a prefix the grammar allows
        assert g.stats.finish_reason == "length"
        c = Constraint(tiny_engine.grammar_tokenizer(), params.grammar)
        assert c.valid_prefix(g.tokens) == len(g.tokens)
