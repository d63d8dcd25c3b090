"""The reference pair (Qwen2.5-Coder 1.5B F16 target, 0.5B draft), constrained by a JSON Schema:
greedy text with speculation is the constrained target alone's, and it validates. The SmolLM2 tests
(test_constrained_engine.py) cover every mode and sampling; this one shows it on the pair users run."""
from __future__ import annotations

import json

import jsonschema
import pytest

from specserve.config import SamplingParams, SpecParams
from specserve.engine import Engine
from specserve.grammar import from_json_schema
from constrained_checks import PERSON, assert_constrained_greedy_equal

pytestmark = pytest.mark.real_models

CHATML = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def pair():
    from specserve import models
    from specserve.backends import load_model

    target = load_model(str(models.ensure("qwen2.5-coder-1.5b-f16")))
    draft = load_model(str(models.ensure("qwen2.5-coder-0.5b")))
    engine = Engine(target, draft, n_ctx=1024)
    yield engine
    engine.close()


def test_reference_pair_constrained_greedy_equals_the_target_alone(pair):
    grammar = from_json_schema(PERSON)
    text = CHATML.format("Extract as JSON: Anna is 31, lives in Berlin and likes chess and tea.")
    prompt = pair.target.tokenize(text, add_special=True, parse_special=True)
    params = SamplingParams(max_tokens=48, grammar=grammar)
    slot = pair.new_slot()
    alone = slot.generate(prompt, params, SpecParams(mode="none"))
    assert alone.stats.finish_reason == "stop", alone.text
    jsonschema.validate(json.loads(alone.text), PERSON)
    for mode in ("draft", "auto"):
        g = slot.generate(prompt, params, SpecParams(mode=mode, draft_max=8))
        assert_constrained_greedy_equal(pair, grammar, prompt, alone.tokens, g.tokens, mode)
        assert g.stats.n_accepted > 0, mode
    slot.close()
