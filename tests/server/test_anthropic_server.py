"""Anthropic's Messages API through the real server with the official `anthropic` SDK, unmodified.

The tiny model carries Qwen2.5's chat template and <tool_call> tokens (server_fixtures.tiny_tools_pair),
so tools are constrained and read back as they are for Qwen2.5. Its text is noise, but deterministic
under greedy decoding: what these tests compare is the same text reached by different ways (the
SDK's stream and its whole answer, /v1/messages and /v1/chat/completions, speculation on and off).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from server_fixtures import API_KEY, ServerProcess, serve_args, tiny_tools_pair  # noqa: E402

pytestmark = pytest.mark.server

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city"],
           "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]}}}
TOOLS = [{"name": "get_weather", "description": "Weather now", "input_schema": WEATHER}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"temperature": 0, "speculative": {"mode": "draft", "draft_max": 4}}  # sent as extra_body: the SDK
# has no sampling parameters of its own any more


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("anthropic")
    tiny_tools_pair(d)
    srv = ServerProcess(serve_args(d, "-c", "2048", "--parallel", "2"), d / "serve.log", api_key=API_KEY)
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in srv.log() and "internal error" not in srv.log()


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key=API_KEY, max_retries=0, timeout=60)


def _create(client, **kw):
    return client.messages.create(**{"model": "claude-sonnet-4-5", "max_tokens": 24, "messages": ASK,
                                     "extra_body": GREEDY, **kw})


def _text(message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def test_a_message_with_system_blocks_and_usage(client):
    m = _create(client, system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}])
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant"
    assert m.model == "claude-sonnet-4-5"  # any model name is served by the loaded model, and echoed
    assert [b.type for b in m.content] == ["text"] and m.stop_reason in ("end_turn", "max_tokens")
    assert m.usage.output_tokens > 0 and m.usage.input_tokens + m.usage.cache_read_input_tokens > 10
    spec = m.usage.speculative  # what speculation did, as on every API
    assert spec["mode"] == "draft" and spec["drafted"] >= spec["accepted"] >= 0 and "draft" in spec["drafter_steps"]


def test_the_stream_is_anthropics_event_sequence_and_adds_up_to_the_whole_answer(server, client):
    body = {"model": "x", "max_tokens": 24, "messages": ASK, "stream": True, **GREEDY}
    names, events = [], []
    with httpx.stream("POST", server.url + "/v1/messages", json=body, headers={"x-api-key": API_KEY,
                      "anthropic-version": "2023-06-01"}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("event: "):
                names.append(line[7:])
            elif line.startswith("data: "):
                events.append(json.loads(line[6:]))
    kinds = [e["type"] for e in events]
    assert names == kinds  # every event is named by its type
    assert kinds[:3] == ["message_start", "ping", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[3:-3]) == {"content_block_delta"}
    start = events[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["output_tokens"] == 0
    assert all(e["index"] == 0 for e in events if "index" in e)
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    delta = events[-2]
    assert delta["usage"]["output_tokens"] > 0 and "speculative" in delta["usage"]
    whole = _create(client, model="x")
    assert text == _text(whole) and delta["delta"]["stop_reason"] == whole.stop_reason


def test_the_sdks_stream_helper_gives_the_whole_answer(client):
    with client.messages.stream(model="x", max_tokens=24, messages=ASK, extra_body=GREEDY) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == _text(final) == _text(_create(client))
    assert final.usage.output_tokens == _create(client).usage.output_tokens


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_tool_use_and_tool_result_round_trip(client, stream):
    kw = dict(max_tokens=80, tools=TOOLS, tool_choice={"type": "any"})
    if stream:
        with client.messages.stream(model="x", messages=ASK, extra_body=GREEDY, **kw) as s:
            first = s.get_final_message()
        whole = _create(client, **kw)  # greedy: the same calls
        assert [(b.type, b.name, b.input) for b in first.content] == [(b.type, b.name, b.input) for b in whole.content]
    else:
        first = _create(client, **kw)
    assert first.stop_reason == "tool_use"
    calls = [b for b in first.content if b.type == "tool_use"]
    assert calls and all(c.name == "get_weather" and c.input["city"] in WEATHER["properties"]["city"]["enum"]
                         for c in calls)
    history = [*ASK, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": c.id, "content": "21 C, sunny"}
                                            for c in calls]}]
    final = _create(client, messages=history, tools=TOOLS, tool_choice={"type": "none"})
    assert final.stop_reason in ("end_turn", "max_tokens") and [b.type for b in final.content] == ["text"]
    counted = client.messages.count_tokens(model="x", messages=history, tools=TOOLS).input_tokens
    assert counted == final.usage.input_tokens + final.usage.cache_read_input_tokens  # the prompt it really ran
    assert counted > client.messages.count_tokens(model="x", messages=ASK, tools=TOOLS).input_tokens + 20


def test_a_named_tool_is_called_and_parallel_calls_can_be_turned_off(client):
    m = _create(client, max_tokens=80, tools=TOOLS + [{"name": "get_time", "input_schema": {"type": "object"}}],
                tool_choice={"type": "tool", "name": "get_time", "disable_parallel_tool_use": True})
    assert [b.name for b in m.content if b.type == "tool_use"] == ["get_time"] and m.stop_reason == "tool_use"


def test_count_tokens_is_what_the_prompt_tokenizes_to(server, client):
    system = "You are terse."
    n = client.messages.count_tokens(model="x", system=system, messages=ASK).input_tokens
    m = _create(client, system=system)
    assert n == m.usage.input_tokens + m.usage.cache_read_input_tokens
    r = httpx.post(server.url + "/v1/messages/count_tokens?beta=true", headers={"x-api-key": API_KEY},
                   json={"model": "x", "system": system, "messages": ASK})
    assert r.status_code == 200 and r.json() == {"input_tokens": n}


def test_stop_sequences_end_the_text_and_are_reported(client):
    plain = _text(_create(client))
    stop = plain[3:6]
    m = _create(client, stop_sequences=[stop])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert _text(m) == plain[:plain.index(stop)]


def test_greedy_text_is_the_same_through_messages_chat_and_the_target_alone(server, client):
    """Speculation on through /v1/messages: the text is the target alone's, and chat's for the same messages."""
    system = "Answer in one line."
    texts = []
    for mode in ("draft", "ngram", "none"):
        texts.append(_text(_create(client, system=system, max_tokens=40,
                                   extra_body={"temperature": 0, "speculative": {"mode": mode}})))
    chat = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0).chat.completions.create(
        model="x", max_tokens=40, temperature=0, messages=[{"role": "system", "content": system}, *ASK],
        extra_body={"speculative": {"mode": "draft"}})
    assert texts[0] == texts[1] == texts[2] == chat.choices[0].message.content


@pytest.mark.parametrize("body, status, kind, words", [
    ({"model": "x", "messages": ASK}, 400, "invalid_request_error", "max_tokens"),
    ({"model": "x", "max_tokens": 8, "messages": []}, 400, "invalid_request_error", "messages"),
    ({"model": "x", "max_tokens": 8, "messages": [{"role": "system", "content": "hi"}]}, 400,
     "invalid_request_error", "messages[0].role"),
    ({"model": "x", "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}]}]}, 400,
     "invalid_request_error", "image input is not supported"),
    ({"model": "x", "max_tokens": 8, "messages": ASK, "temperature": "hot"}, 400, "invalid_request_error",
     "temperature"),
    ({"model": "x", "max_tokens": 8, "messages": ASK, "tool_choice": {"type": "any"}}, 400,
     "invalid_request_error", "tool_choice"),
    ({"model": "x", "max_tokens": 8, "messages": ASK, "speculative": {"mode": "nope"}}, 400,
     "invalid_request_error", "speculative"),
    ({"model": "x", "max_tokens": 8, "messages": ASK, "thinking": {"type": "enabled"}}, 400,
     "invalid_request_error", "thinking.budget_tokens"),
    # refused here as on every API (server/apis/builder.py), not answered while ignored
    ({"model": "x", "max_tokens": 8, "messages": ASK, "mirostat": 2}, 400, "invalid_request_error", "mirostat"),
    ({"model": "x", "max_tokens": 8, "messages": ASK, "verify": "rejection"}, 400, "invalid_request_error",
     "speculative"),
    ({"model": "x", "max_tokens": 8, "messages": ASK, "draft_max": 4}, 400, "invalid_request_error", "speculative"),
    ({"model": "x", "max_tokens": 8, "messages": ASK, "id_slot": -5}, 400, "invalid_request_error", "id_slot"),
    ({"model": "x", "max_tokens": 8, "messages": ASK, "stop": [f"s{i}" for i in range(16)],
      "stop_sequences": [f"t{i}" for i in range(16)]}, 400, "invalid_request_error", "stop_sequences"),
])
def test_refusals_have_anthropics_error_shape(server, body, status, kind, words):
    r = httpx.post(server.url + "/v1/messages", json=body, headers={"x-api-key": API_KEY}, timeout=30)
    assert r.status_code == status
    assert set(r.json()) == {"type", "error"} and r.json()["type"] == "error"
    assert r.json()["error"]["type"] == kind and words in r.json()["error"]["message"]


def test_the_sdk_raises_its_own_errors(server, client):
    with pytest.raises(anthropic.AuthenticationError) as e:
        anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0).messages.create(
            model="x", max_tokens=8, messages=ASK)
    assert e.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="x", max_tokens=8, messages=[])
    assert e.value.body["type"] == "error"
    r = httpx.get(server.url + "/v1/messages", headers={"x-api-key": API_KEY})
    assert r.status_code == 405 and r.json()["type"] == "error"


def test_thinking_is_accepted_with_a_budget(client):
    m = _create(client, thinking={"type": "enabled", "budget_tokens": 50})
    assert m.content and m.stop_reason in ("end_turn", "max_tokens")


def test_the_trace_extension_covers_the_text_whole_and_streamed(server, client):
    """speculative.trace (docs/webui.md): who produced each token, through Anthropic's shapes too."""
    extra = {**GREEDY, "speculative": {"mode": "draft", "trace": True}}
    whole = client.messages.create(model="x", max_tokens=24, messages=ASK, extra_body=extra)
    trace = whole.model_extra["speculative_trace"]
    assert "".join(e["text"] for e in trace) == _text(whole) and {e["source"] for e in trace} <= {"draft", "target"}
    assert "target_alone_tokens_per_s" in whole.usage.speculative
    body = {"model": "x", "max_tokens": 24, "messages": ASK, "stream": True, **extra}
    with httpx.stream("POST", server.url + "/v1/messages", json=body, headers={"x-api-key": API_KEY}) as r:
        deltas = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    texts = [e for e in deltas if e["type"] == "content_block_delta"]
    assert texts and all("".join(x["text"] for x in e["speculative_trace"]) == e["delta"]["text"] for e in texts)
