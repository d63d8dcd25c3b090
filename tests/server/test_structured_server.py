"""Structured output through the real server: OpenAI's response_format and llama-server's
json_schema and grammar, constrained with speculation on; and each refusal (server/apis/constraint_fields.py)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from server_fixtures import ServerProcess, chat, events, serve_args, tiny_tools_pair  # noqa: E402

pytestmark = pytest.mark.server

jsonschema = pytest.importorskip("jsonschema")

CH, C, L, INF = "/v1/chat/completions", "/v1/completions", "/completion", "/infill"
MSG = [{"role": "user", "content": "Describe a person as JSON."}]
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "ok", "tags"],
          "properties": {"name": {"type": "string", "maxLength": 8},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "ok": {"type": "boolean"},
                         "tags": {"type": "array", "items": {"enum": ["red", "green"]}, "maxItems": 3}}}
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
DRAFT = {"mode": "draft", "draft_max": 4}
ASK = {"messages": MSG, "max_tokens": 120, "temperature": 0}  # a chat, greedy


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    d = tmp_path_factory.mktemp("structured")
    tiny_tools_pair(d)
    srv = ServerProcess(serve_args(d, "-c", "2048", "--parallel", "2"), d / "serve.log")
    with srv.client() as c:
        yield c
    assert srv.stop() == 0
    assert "Traceback" not in srv.log() and "internal error" not in srv.log()


@pytest.mark.parametrize("spec", [DRAFT, {"mode": "none"}], ids=["draft", "none"])
def test_json_schema_output_parses_and_validates(http, spec):
    choice = chat(http, ASK, response_format=FORMAT, speculative=spec)["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    jsonschema.validate(json.loads(choice["message"]["content"]), PERSON)


def test_speculation_under_the_schema_gives_the_target_alone_s_text(http):
    texts = [chat(http, ASK, response_format=FORMAT, speculative=s)["choices"][0]["message"]["content"]
             for s in (DRAFT, {"mode": "none"}, {"mode": "ngram"})]
    assert texts[0] == texts[1] == texts[2]


def test_json_schema_streamed(http):
    streamed = events(http, CH, {**ASK, "stream": True, "response_format": FORMAT})
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in streamed if e["choices"])
    jsonschema.validate(json.loads(text), PERSON)
    assert text == chat(http, ASK, response_format=FORMAT)["choices"][0]["message"]["content"]


def test_json_object_on_completions(http):
    r = http.post(C, json={"prompt": "A JSON object:", "max_tokens": 200, "temperature": 0,
                           "response_format": {"type": "json_object"}})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(choice["text"]), dict)
    else:  # cut by max_tokens: what there is is the start of an object
        assert choice["finish_reason"] == "length" and choice["text"].lstrip().startswith("{")


def test_llama_completion_with_json_schema_and_grammar(http):
    r = http.post(L, json={"prompt": "Person:", "n_predict": 120, "temperature": 0, "json_schema": PERSON})
    assert r.status_code == 200, r.text
    jsonschema.validate(json.loads(r.json()["content"]), PERSON)
    r = http.post(L, json={"prompt": "Answer:", "n_predict": 20, "temperature": 0,
                           "grammar": 'root ::= ("yes" | "no") " " [0-9] "!"'})
    assert r.status_code == 200, r.text
    content = r.json()["content"]
    assert content[:-3] in ("yes", "no") and content[-3] == " " and content[-2].isdigit() and content[-1] == "!"


def test_the_grammar_time_is_reported_under_a_constraint_only(http):
    """usage.speculative.grammar_s (OpenAI endpoints) and timings.grammar_ms (/completion): the request's
    time in the grammar, part of its decode time; absent without a constraint."""
    spec = chat(http, ASK, response_format=FORMAT, speculative=DRAFT)["usage"]["speculative"]
    assert 0 < spec["grammar_s"] < spec["decode_s"]
    free = chat(http, ASK, speculative=DRAFT, max_tokens=8)["usage"]["speculative"]
    assert "grammar_s" not in free
    answer = http.post(L, json={"prompt": "Person:", "n_predict": 60, "temperature": 0, "json_schema": PERSON}).json()
    assert 0 < answer["timings"]["grammar_ms"] < answer["timings"]["predicted_ms"]
    assert 0 < 1000 * answer["speculative"]["grammar_s"] == pytest.approx(answer["timings"]["grammar_ms"], abs=0.01)
    assert "grammar_ms" not in http.post(L, json={"prompt": "Person:", "n_predict": 4}).json()["timings"]


def test_a_schema_cut_by_max_tokens_ends_with_length(http):
    choice = chat(http, ASK, response_format=FORMAT, max_tokens=3)["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["content"].startswith("{")


BAD = [
    (CH, {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format.json_schema.schema"),
    (CH, {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema"),
    (CH, {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "string", "format": "no-such-format"}}}}, "response_format.json_schema.schema"),
    (CH, {"response_format": {"type": "xml"}}, "response_format.type"),
    (CH, {"response_format": {"type": "json_object", "scheme": {}}}, "response_format.scheme"),  # (llama-server's
    # json_object takes a `schema`: tests/server/test_llama_server_api.py)
    (CH, {"response_format": "json"}, "response_format"),
    (C, {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object",
                                                                              "properties": {"a": 7}}}}},
     "response_format.json_schema.schema"),
    (L, {"grammar": "root ::= ( unclosed"}, "grammar"),
    (L, {"grammar": 7}, "grammar"),
    (L, {"json_schema": "not a schema"}, "json_schema"),
    (L, {"json_schema": {"type": "object"}, "grammar": 'root ::= "a"'}, "json_schema"),
    (CH, {"response_format": {"type": "json_object"}, "json_schema": PERSON}, "json_schema"),
    (INF, {"grammar": 'root ::= "a"'}, "grammar"),
    (INF, {"response_format": {"type": "json_object"}}, "response_format"),
]


@pytest.mark.parametrize("path,fields,param", BAD, ids=[
    "invalid-schema", "no-schema", "unsupported-keyword", "unknown-type", "unknown-field", "not-an-object",
    "bad-property-schema",
    "invalid-gbnf", "grammar-not-a-string", "json-schema-not-an-object", "grammar-and-json-schema",
    "response-format-and-json-schema", "infill-grammar", "infill-response-format"])
def test_bad_constraints_are_400_naming_the_field(http, path, fields, param):
    base = {"messages": MSG} if path == CH else {"input_prefix": "def f(", "input_suffix": ")"} if path == INF \
        else {"prompt": "hi"}
    r = http.post(path, json={**base, "max_tokens": 4, **fields})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error", err
    if path == INF:  # /infill takes no constraint, as before
        assert err["code"] == "unsupported_parameter"
    if len(set(fields) & {"grammar", "json_schema", "response_format"}) > 1:
        assert all(k in err["message"] for k in fields), err  # a conflict names both fields
