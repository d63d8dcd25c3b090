"""Tools on a model whose chat template spells no tool call, through the real server: the tiny model's
plain ChatML template (SmolLM2's kind) gets the generic form (server/core/constraints/generic.py), so a
call comes back, whole and streamed, on /v1/chat/completions, /v1/messages and /v1/responses."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from server_fixtures import ServerProcess, chat, events, post, serve_args, tiny_pair  # noqa: E402

pytestmark = pytest.mark.server

jsonschema = pytest.importorskip("jsonschema")

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city"],
           "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]}}}
TIME = {"type": "object", "additionalProperties": False, "properties": {}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"temperature": 0, "max_tokens": 400, "speculative": {"mode": "draft", "draft_max": 4}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("generic")
    tiny_pair(d)
    srv = ServerProcess(serve_args(d, "-c", "2048", "--parallel", "2"), d / "serve.log")
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in srv.log() and "internal error" not in srv.log()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def _answer(http, stream: bool, **body) -> tuple[str | None, list[dict], str]:
    """content, calls ({name, arguments}) and finish_reason of a chat for the weather, whole or put together
    from the stream's deltas."""
    body = {"messages": ASK, "tools": TOOLS, **GREEDY, **body, "stream": stream}
    if not stream:
        choice = chat(http, body)["choices"][0]
        calls = [c["function"] for c in choice["message"].get("tool_calls") or []]
        return choice["message"]["content"], calls, choice["finish_reason"]
    content, calls, finish = "", {}, None
    for chunk in events(http, "/v1/chat/completions", body):
        if not chunk.get("choices"):
            continue
        d = chunk["choices"][0]["delta"]
        content += d.get("content") or ""
        for tc in d.get("tool_calls") or []:
            call = calls.setdefault(tc["index"], {"name": tc["function"].get("name"), "arguments": ""})
            call["arguments"] += tc["function"].get("arguments") or ""
        finish = chunk["choices"][0]["finish_reason"] or finish
    return content or None, [calls[i] for i in sorted(calls)], finish


def test_the_start_up_log_names_the_generic_form(server):
    assert "tool calls: generic JSON" in server.log()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("choice,parallel", [("required", False), ("required", True),
                                             ({"type": "function", "function": {"name": "get_time"}}, False)],
                         ids=["required", "required-parallel", "named"])
def test_a_chatml_template_gets_calls_back(http, stream, choice, parallel):
    content, calls, finish = _answer(http, stream, tool_choice=choice, parallel_tool_calls=parallel)
    assert calls and finish == "tool_calls" and content is None
    assert len(calls) == 1 or parallel
    for call in calls:
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])
    if isinstance(choice, dict):
        assert [c["name"] for c in calls] == ["get_time"]
    assert (content, calls, finish) == _answer(http, not stream, tool_choice=choice, parallel_tool_calls=parallel)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_auto_gives_a_reply_or_a_call_never_the_json_around_them(http, stream):
    content, calls, finish = _answer(http, stream, tool_choice="auto")
    assert bool(calls) != bool(content)
    assert not (content or "").lstrip().startswith('{"')  # the reply's text, decoded from the JSON string
    assert (content, calls, finish) == _answer(http, not stream, tool_choice="auto")


def test_none_answers_text_without_the_generic_json(http):
    content, calls, finish = _answer(http, False, tool_choice="none", max_tokens=12)
    assert not calls and finish == "length" and not content.lstrip().startswith('{"')


HISTORY = ASK + [{"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "sunny, 25 C"}]


def test_a_round_trip_renders_calls_and_results_in_the_generic_form(http):
    prompt = http.post("/apply-template", json={"messages": HISTORY, "tools": TOOLS}).json()["prompt"]
    assert "<|im_start|>system\nYou can call any of the following tools" in prompt
    assert '<|im_start|>assistant\n{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}' in prompt
    assert '<|im_start|>user\n{"tool_response": {"tool": "get_weather", "content": "sunny, 25 C"}}' in prompt
    n = http.post("/v1/chat/completions/input_tokens", json={"messages": HISTORY, "tools": TOOLS}).json()
    assert n["input_tokens"] == len(http.post("/tokenize", json={"content": prompt}).json()["tokens"])
    r = http.post("/v1/chat/completions", json={"messages": HISTORY, "tools": TOOLS, **GREEDY, "max_tokens": 8})
    assert r.status_code == 200, r.text
    r = http.post("/v1/chat/completions", json={"messages": HISTORY, **GREEDY, "max_tokens": 8})  # history alone
    assert r.status_code == 200, r.text


ANTHROPIC_TOOLS = [{"name": "get_weather", "description": "Weather now", "input_schema": WEATHER}]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_anthropic_messages_get_a_tool_use_block(http, stream):
    body = {"model": "tiny", "max_tokens": 200, "temperature": 0, "messages": ASK, "tools": ANTHROPIC_TOOLS,
            "tool_choice": {"type": "any"}, "stream": stream}
    if not stream:
        answer = post(http, "/v1/messages", body)
        blocks = answer["content"]
        assert answer["stop_reason"] == "tool_use" and [b["type"] for b in blocks] == ["tool_use"]
        jsonschema.validate(blocks[0]["input"], WEATHER)
        return
    streamed = events(http, "/v1/messages", body)
    starts = [e for e in streamed if e["type"] == "content_block_start"]
    assert [s["content_block"]["type"] for s in starts] == ["tool_use"] and starts[0]["index"] == 0
    assert starts[0]["content_block"]["name"] == "get_weather"
    partial = "".join(e["delta"]["partial_json"] for e in streamed
                      if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta")
    jsonschema.validate(json.loads(partial), WEATHER)
    assert [e["delta"]["stop_reason"] for e in streamed if e["type"] == "message_delta"] == ["tool_use"]


def test_anthropic_tool_results_are_rendered(http):
    """llama.cpp's test_anthropic_tool_result: the history's tool_use and tool_result on a ChatML model."""
    body = {"model": "tiny", "max_tokens": 8, "messages": [
        {"role": "user", "content": "What's the weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "text", "text": "Here:"},
                                     {"type": "tool_result", "tool_use_id": "t1", "content": "Sunny"}]}]}
    r = http.post("/v1/messages", json=body)
    assert r.status_code == 200 and r.json()["content"][0]["type"] == "text", r.text
    count = http.post("/v1/messages/count_tokens", json={**body, "tools": ANTHROPIC_TOOLS})
    assert count.status_code == 200 and count.json()["input_tokens"] > 0


def test_responses_get_a_function_call(http):
    body = {"model": "tiny", "input": "What is the weather in Paris?", "max_output_tokens": 200, "temperature": 0,
            "tools": [{"type": "function", "name": "get_weather", "parameters": WEATHER}], "tool_choice": "required"}
    r = http.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    items = [o for o in r.json()["output"] if o["type"] == "function_call"]
    assert len(items) == 1 and items[0]["name"] == "get_weather"
    jsonschema.validate(json.loads(items[0]["arguments"]), WEATHER)
