"""What the constrained-generation tests share: a person's JSON schema, the SmolLM2 pair as an engine, and
the greedy comparison under a grammar (a divergence only at a near-tie of the constrained target's logits)."""
from __future__ import annotations

import numpy as np
import pytest

from specserve.engine import Engine
from specserve.grammar import Constraint
from lossless_checks import EPS_F16


PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 20},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "city": {"type": "string", "enum": ["Paris", "London", "Berlin"]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3}},
    "required": ["name", "age", "city", "tags"], "additionalProperties": False}


@pytest.fixture(scope="module")
def smol(real_model_paths):
    from specserve.backends import load_model

    target = load_model(str(real_model_paths["smollm2-f16"]))
    draft = load_model(str(real_model_paths["smollm2-q4_1"]))
    engine = Engine(target, draft, n_ctx=1024)
    yield engine
    engine.close()


def masked_top2_gap(engine: Engine, grammar: str, prompt: list[int], tokens: list[int]) -> float:
    """The constrained target's top-2 logit gap before the last of `tokens`, one token at a time."""
    c = Constraint(engine.grammar_tokenizer(), grammar)
    c.commit(tokens[:-1])
    ctx = engine.target.new_context(1024)
    try:
        with c.ahead() as walk:
            row = walk.mask(ctx.eval([*prompt, *tokens[:-1]])[0].copy())
        top = np.sort(row)[-2:]
        return float(top[1] - top[0])
    finally:
        ctx.close()


def assert_constrained_greedy_equal(engine, grammar, prompt, reference, tokens, label):
    """Equal token for token, or diverging only where the constrained target's top two are a near-tie
    (llama.cpp's batched and one-token logits differ in the last bits: test_lossless.py)."""
    n = min(len(reference), len(tokens))
    i = next((i for i in range(n) if reference[i] != tokens[i]), None)
    if i is None:
        assert len(reference) == len(tokens), label
        return
    gap = masked_top2_gap(engine, grammar, prompt, reference[: i + 1])
    assert gap < EPS_F16, f"{label}: diverged at token {i} where the masked top-2 gap is {gap:.4f}"
