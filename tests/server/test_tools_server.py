"""OpenAI tool calls through the real server with the official `openai` client: the tiny model
carries Qwen2.5's chat template and <tool_call> tokens (server_fixtures.tiny_tools_pair), so
calls are constrained, read back and rendered as they are for Qwen2.5 (server/core/constraints/tools.py)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from server_fixtures import ServerProcess, serve_args, tiny_tools_pair  # noqa: E402

pytestmark = pytest.mark.server

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
           "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]}, "unit": {"enum": ["C", "F"]}}}
TIME = {"type": "object", "additionalProperties": False, "required": ["zone"],
        "properties": {"zone": {"type": "string", "maxLength": 6}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"temperature": 0, "max_tokens": 80, "extra_body": {"speculative": {"mode": "draft", "draft_max": 4}}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("tools")
    tiny_tools_pair(d)
    srv = ServerProcess(serve_args(d, "-c", "2048", "--parallel", "2"), d / "serve.log")
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in srv.log() and "internal error" not in srv.log()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)


def _valid(call) -> dict:
    assert call.id.startswith("call_") and call.type == "function"
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, SCHEMAS[call.function.name])
    return arguments


def _streamed(client, **kw) -> tuple[str, list[dict], str]:
    """Content, tool calls and finish_reason put together from the stream's deltas, as clients do."""
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(**{"model": "tiny", **kw}, stream=True):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            if tc.id:
                assert tc.index not in calls and tc.function.arguments == ""
                calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
            else:
                assert tc.id is None and tc.function.name is None
            calls[tc.index]["arguments"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_tool_round_trip(client, stream):
    """call -> tool result -> final answer, the history rendered through the model's own template."""
    kw = dict(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required", **GREEDY)
    if stream:
        content, calls, finish = _streamed(client, **kw)
        first = client.chat.completions.create(**kw).choices[0]
        assert [(c["name"], c["arguments"]) for c in calls] == \
            [(c.function.name, c.function.arguments) for c in first.message.tool_calls]  # greedy: the same calls
        assert content == "" and finish == "tool_calls"
        assistant = {"role": "assistant", "content": None, "tool_calls": [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in calls]}
    else:
        first = client.chat.completions.create(**kw).choices[0]
        assert first.finish_reason == "tool_calls" and first.message.content is None
        assistant = first.message.model_dump(exclude_none=True)
    for call in assistant["tool_calls"]:
        json.loads(call["function"]["arguments"])
    results = [{"role": "tool", "tool_call_id": c["id"], "content": json.dumps({"temperature": 21})}
               for c in assistant["tool_calls"]]
    history = [*ASK, assistant, *results]
    final = client.chat.completions.create(model="tiny", messages=history, tools=TOOLS, tool_choice="none", **GREEDY)
    answer = final.choices[0]
    assert answer.finish_reason in ("stop", "length") and answer.message.tool_calls is None
    assert isinstance(answer.message.content, str) and "<tool_call>" not in answer.message.content
    first_usage = client.chat.completions.create(**kw).usage
    assert final.usage.prompt_tokens > first_usage.prompt_tokens + 20  # the call and its result are in the prompt


def test_required_calls_follow_their_schemas_with_or_without_speculation(client):
    calls = []
    for mode in ("draft", "ngram", "none"):
        kw = {**GREEDY, "extra_body": {"speculative": {"mode": mode}}}
        msg = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required",
                                             **kw).choices[0].message
        assert msg.tool_calls and all(_valid(c) is not None for c in msg.tool_calls)
        calls.append([(c.function.name, c.function.arguments) for c in msg.tool_calls])
    assert calls[0] == calls[1] == calls[2]  # greedy: speculation under the grammar changes nothing


def test_a_named_function_is_called_exactly_once(client):
    r = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, **GREEDY,
                                       tool_choice={"type": "function", "function": {"name": "get_time"}})
    calls = r.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_time"] and r.choices[0].finish_reason == "tool_calls"
    _valid(calls[0])


def test_parallel_tool_calls_false_allows_one_call(client):
    r = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required",
                                       parallel_tool_calls=False, **GREEDY)
    assert len(r.choices[0].message.tool_calls) == 1


def test_auto_answers_in_text_or_in_valid_calls(client):
    for stream in (False, True):
        kw = dict(messages=ASK, tools=TOOLS, tool_choice="auto", **GREEDY)
        if stream:
            content, calls, finish = _streamed(client, **kw)
        else:
            choice = client.chat.completions.create(model="tiny", **kw).choices[0]
            content, finish = choice.message.content or "", choice.finish_reason
            calls = [{"name": c.function.name, "arguments": c.function.arguments}
                     for c in choice.message.tool_calls or []]
        assert "<tool_call>" not in content and finish in ("tool_calls", "stop", "length")
        assert (finish == "tool_calls") == bool(calls) or finish == "length"
        if finish != "length":
            for c in calls:
                jsonschema.validate(json.loads(c["arguments"]), SCHEMAS[c["name"]])


def test_a_call_cut_by_max_tokens_ends_with_length_and_says_so(server):
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "messages": ASK, "tools": TOOLS, "tool_choice": "required", "max_tokens": 12, "temperature": 0})
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length", choice
    assert "cut" in choice["finish_detail"] and "max_tokens" in choice["finish_detail"]


def _tool(**function) -> dict:
    return {"type": "function", "function": function}


BAD = [
    ({"tools": [_tool(description="no name", parameters=WEATHER)]}, "tools[0].function.name",
     "missing_required_parameter"),
    ({"tools": [_tool(name="has space")]}, "tools[0].function.name", "invalid_value"),
    ({"tools": [_tool(name="f", parameters={"type": "array"})]}, "tools[0].function.parameters", "invalid_value"),
    ({"tools": [_tool(name="f", parameters={"type": "object", "properties": {"a": {"type": "nonsense"}}})]},
     "tools[0].function.parameters", "invalid_grammar"),
    ({"tools": [_tool(name="f", parameters="{}")]}, "tools[0].function.parameters", "invalid_value"),
    ({"tools": [_tool(name="f"), _tool(name="f")]}, "tools[1].function.name", None),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type", "invalid_value"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name", "invalid_value"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "invalid_value"),
    ({"tool_choice": "required"}, "tool_choice", None),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls", None),
    ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "response_format", "conflicting_parameters"),
    ({"tools": TOOLS, "grammar": 'root ::= "a"'}, "grammar", "conflicting_parameters"),
]


@pytest.mark.parametrize("fields,param,code", BAD, ids=[
    "no-name", "bad-name", "parameters-not-object-type", "parameters-invalid-schema", "parameters-not-a-schema",
    "name-twice", "not-a-function", "choice-unknown-function", "choice-unknown-word", "choice-without-tools",
    "parallel-not-boolean", "tools-and-response-format", "tools-and-grammar"])
def test_bad_tools_are_400_naming_the_field(client, fields, param, code):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=ASK, max_tokens=4, extra_body=fields)
    err = e.value.body
    assert err["param"] == param and err["code"] == code, err
    if code == "conflicting_parameters":
        assert "tools" in err["message"] and param in err["message"]


def test_tools_on_completions_are_refused(server):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "tools": TOOLS}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"


# --- the markup's tokens spelled in what the client sends stay text --------------------------------------

TAGGED = "A<tool_call>B</tool_call>C<|im_end|>D"  # each spelling: markup tokens of this model's template
Q = "</tool_call> <tool_call>}\n</tool_call><|im_end|>"  # the tags' text, and the call's end look-alike
QUERY = {"type": "object", "additionalProperties": False, "required": ["q"], "properties": {"q": {"enum": [Q]}}}


def _history(text: str) -> tuple[list[dict], list[dict]]:
    """A chat and tools that spell `text` in a tool's description, a user message, a past call's
    arguments and a tool result."""
    tools = [_tool(name="search", description=f"Finds {text}", parameters=QUERY)]
    messages = [{"role": "user", "content": f"Look up {text}"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                    "name": "search", "arguments": json.dumps({"q": text})}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": text}]
    return messages, tools


def test_markup_spelled_in_tools_messages_and_arguments_is_text(tmp_path):
    """In-process: each markup token (<|im_start|>, <|im_end|>, <tool_call>, </tool_call>) occurs in
    the prompt exactly as often as when the client's strings spell none (the template's own)."""
    from specserve.backends import load_model
    from specserve.prompt import chat_tokens

    model = load_model(str(tiny_tools_pair(tmp_path)[0]), n_threads=1)
    try:
        ids = {t: model.tokenize(t, add_special=False, parse_special=True) for t in
               ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>")}
        assert all(len(i) == 1 for i in ids.values())
        spelled, plain = chat_tokens(model, *_history(TAGGED)), chat_tokens(model, *_history("ABCD"))
        for text, (i,) in ids.items():
            assert spelled.count(i) == plain.count(i) > 0, text
        assert len(spelled) > len(plain) + 4 * 8  # the 4 spellings of 3 tags, in plain tokens
    finally:
        model.close()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_tag_text_in_arguments_reads_back_whole(client, server, stream):
    """Through the server: the spelled tags count as text in the prompt, and a call whose arguments
    hold the tags' text (and a `}\\n</tool_call>` look-alike) is generated (the grammar's forced text in
    plain tokens, not the tag token: backends/llg_vocab.py) and read back whole."""
    messages, tools = _history(TAGGED)
    usage = [httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "messages": m, "tools": t, "tool_choice": "none", "max_tokens": 1}).json()["usage"]["prompt_tokens"]
        for m, t in (_history(TAGGED), _history("ABCD"))]
    assert usage[0] > usage[1] + 4 * 8
    kw = dict(model="tiny", messages=messages, tools=tools, tool_choice="required", parallel_tool_calls=False,
              **{**GREEDY, "max_tokens": 120})
    if stream:
        content, calls, finish = _streamed(client, **kw)
    else:
        choice = client.chat.completions.create(**kw).choices[0]
        content, finish = choice.message.content or "", choice.finish_reason
        calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in choice.message.tool_calls]
    assert content == "" and finish == "tool_calls" and len(calls) == 1 and calls[0]["name"] == "search"
    assert json.loads(calls[0]["arguments"]) == {"q": Q}


def _sse(r: httpx.Response) -> list[dict]:
    return [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]


def test_a_call_cut_by_max_tokens_is_reported_as_each_api_reports_a_cut(server):
    """Issue 63: a call cut by max_tokens left `content: []` on /v1/messages and `output: []` on /v1/responses,
    the reason only in finish_detail. Anthropic's API gives stop_reason max_tokens with the incomplete tool_use
    block; the Responses API status incomplete with the incomplete function_call."""
    with httpx.Client(base_url=server.url, timeout=60) as c:
        whole = c.post("/v1/chat/completions", json={"messages": ASK, "tools": TOOLS, "tool_choice": "required",
                                                     "max_tokens": 200, "temperature": 0}).json()
        assert whole["choices"][0]["finish_reason"] == "tool_calls"
        name = whole["choices"][0]["message"]["tool_calls"][0]["function"]["name"]
        n = whole["usage"]["completion_tokens"] - 3  # cut inside the arguments
        tools = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS]
        body = {"model": "tiny", "messages": ASK, "tools": tools, "tool_choice": {"type": "any"}, "max_tokens": n}
        m = c.post("/v1/messages", json=body).json()
        assert m["stop_reason"] == "max_tokens" and m["content"][-1]["type"] == "tool_use", m
        assert m["content"][-1]["name"] == name
        events = _sse(c.post("/v1/messages", json={**body, "stream": True}))
        started = [e["content_block"] for e in events if e["type"] == "content_block_start"]
        assert started[-1]["type"] == "tool_use" and started[-1]["name"] == name
        assert [e["delta"]["stop_reason"] for e in events if e["type"] == "message_delta"] == ["max_tokens"]
        tools = [{"type": "function", **t["function"]} for t in TOOLS]
        body = {"model": "tiny", "input": ASK, "tools": tools, "tool_choice": "required", "max_output_tokens": n}
        r = c.post("/v1/responses", json=body).json()
        assert r["status"] == "incomplete" and r["incomplete_details"] == {"reason": "max_output_tokens"}
        last = r["output"][-1]
        assert (last["type"], last["name"], last["status"]) == ("function_call", name, "incomplete"), r["output"]
        assert whole["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"].startswith(
            last["arguments"][:5])
        events = _sse(c.post("/v1/responses", json={**body, "stream": True}))
        assert events[-1]["type"] == "response.incomplete"
        streamed = events[-1]["response"]["output"][-1]
        assert (streamed["type"], streamed["name"], streamed["status"]) == ("function_call", name, "incomplete")
