"""llguidance's tokenizer for a llama.cpp vocabulary with added tokens spelled like tags (Qwen2.5's
<tool_call>, Gemma 3's <b>): text the grammar forces is tokenized as text, never as the tag token."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from specserve.backends import load_model
from specserve.config import SamplingParams, SpecParams
from specserve.engine import Engine
from specserve.grammar import Constraint, from_json_schema

sys.path.insert(0, str(Path(__file__).parent.parent))
from server_fixtures import tiny_tools_pair  # noqa: E402


def _enum(value: str) -> str:
    return from_json_schema({"type": "object", "properties": {"t": {"enum": [value]}}, "required": ["t"],
                             "additionalProperties": False})


def test_forced_text_spelling_a_tag_is_plain_tokens(tmp_path):
    model = load_model(str(tiny_tools_pair(tmp_path)[0]), n_threads=1)
    try:
        tok = model.grammar_tokenizer()
        tag = model.tokenize("</tool_call>", add_special=False, parse_special=True)
        assert len(tag) == 1 and tok.is_special_token(tag[0])
        assert tag[0] not in tok.tokenize_str('"</tool_call><tool_call>"')
        assert tok.decode_str(tok.tokenize_str('"</tool_call>" x')) == '"</tool_call>" x'
        assert tok.tokenize_str("plain text") == model.tokenize("plain text", add_special=False)
        forced = Constraint(tok, _enum("a</tool_call>b")).forced(64)
        assert tag[0] not in forced and tok.decode_str(forced) == '{"t": "a</tool_call>b"}'
    finally:
        model.close()


def test_gemma_writes_html_tags_a_schema_forces(real_model_paths):
    """Gemma 3's <b> is an added token llguidance marks special; forced inside a string it used to end
    the request in a grammar error ("forced bytes: got '<'; applying '\\xff'")."""
    model = load_model(str(real_model_paths["gemma"]), n_threads=1)
    try:
        engine = Engine(model, None, n_ctx=256)
        g = engine.new_slot().generate("JSON:", SamplingParams(max_tokens=30, grammar=_enum("<b>bold</b> text")),
                                       SpecParams(mode="none"))
        assert g.stats.grammar_error is None and json.loads(g.text) == {"t": "<b>bold</b> text"}
    finally:
        model.close()
