"""OpenAI's Responses API through the real server with the official `openai` SDK's `client.responses`.

The tiny model carries Qwen2.5's chat template and <tool_call> tokens (server_fixtures.tiny_tools_pair).
Its text is noise, deterministic under greedy decoding: the tests compare the same text reached by
different ways (stream and whole, /v1/responses and /v1/chat/completions, speculation on and off).
"""
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

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city"],
           "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]}}}
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather now", "parameters": WEATHER}]
ASK = "What is the weather in Paris?"
SPEC = {"speculative": {"mode": "draft", "draft_max": 4}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("responses")
    tiny_tools_pair(d)
    srv = ServerProcess(serve_args(d, "-c", "2048", "--parallel", "2"), d / "serve.log")
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in srv.log() and "internal error" not in srv.log()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)


def _create(client, **kw):
    return client.responses.create(**{"model": "gpt-4.1", "input": ASK, "max_output_tokens": 24, "temperature": 0,
                                      "extra_body": SPEC, **kw})


def test_a_response_with_instructions_and_usage(client):
    r = _create(client, instructions="Be brief.",
                input=[{"role": "user", "content": [{"type": "input_text", "text": ASK}]}])
    assert r.id.startswith("resp_") and r.object == "response" and r.model == "gpt-4.1"
    assert [o.type for o in r.output] == ["message"] and r.output[0].id.startswith("msg_")
    assert r.output_text and r.status in ("completed", "incomplete")
    if r.status == "incomplete":  # OpenAI's way of saying max_output_tokens ended it
        assert r.incomplete_details.reason == "max_output_tokens" and r.usage.output_tokens == 24
    assert r.usage.input_tokens > 10 and r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    spec = r.usage.speculative
    assert spec["mode"] == "draft" and spec["drafted"] >= spec["accepted"] >= 0


def test_the_stream_is_the_responses_event_sequence_and_adds_up_to_the_whole_answer(client):
    events = list(_create(client, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    item_id = events[2].item.id
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert deltas and all(e.item_id == item_id and e.output_index == 0 for e in deltas)
    final = events[-1].response
    whole = _create(client)
    assert "".join(e.delta for e in deltas) == final.output_text == whole.output_text
    assert final.id == events[0].response.id and final.status == whole.status
    assert final.usage.output_tokens == whole.usage.output_tokens and "speculative" in final.usage.model_extra


def test_the_sdks_stream_helper_completes(client):
    """An answer that ends on its own (here at a stop string, a specserve extension on this API) is completed."""
    plain = _create(client).output_text
    kw = {"extra_body": {**SPEC, "stop": [plain[4:7]]}, "max_output_tokens": 60}
    with client.responses.stream(model="x", input=ASK, temperature=0, **kw) as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert final.status == "completed" and text == final.output_text == plain[:plain.index(plain[4:7])]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_function_call_round_trip(client, stream):
    kw = dict(tools=TOOLS, tool_choice="required", max_output_tokens=80)
    if stream:
        with client.responses.stream(model="x", input=ASK, temperature=0, extra_body=SPEC, **kw) as s:
            kinds = [e.type for e in s]
            first = s.get_final_response()
        assert kinds[2] == "response.output_item.added" and "response.function_call_arguments.delta" in kinds
        assert "response.function_call_arguments.done" in kinds and kinds[-1] == "response.completed"
    else:
        first = _create(client, **kw)
    assert first.status == "completed"
    calls = [o for o in first.output if o.type == "function_call"]
    assert calls and all(c.name == "get_weather" and c.id.startswith("fc_") for c in calls)
    assert all(json.loads(c.arguments)["city"] in ("Paris", "Rome", "Oslo") for c in calls)
    if stream:
        assert [(c.name, c.arguments) for c in calls] == \
            [(o.name, o.arguments) for o in _create(client, **kw).output]  # greedy: the same calls
    history = [{"role": "user", "content": ASK}, *[o.model_dump(exclude_none=True) for o in first.output],
               *[{"type": "function_call_output", "call_id": c.call_id, "output": "21 C, sunny"} for c in calls]]
    final = _create(client, input=history, tools=TOOLS, tool_choice="none")
    assert [o.type for o in final.output] == ["message"] and final.output_text
    counted = client.responses.input_tokens.count(model="x", input=history, tools=TOOLS).input_tokens
    assert counted == final.usage.input_tokens  # the prompt it really ran
    assert counted > client.responses.input_tokens.count(model="x", input=ASK, tools=TOOLS).input_tokens + 20


def test_greedy_text_is_the_same_through_responses_chat_and_the_target_alone(client):
    texts = [_create(client, instructions="One line.", max_output_tokens=40,
                     extra_body={"speculative": {"mode": mode}}).output_text for mode in ("draft", "ngram", "none")]
    chat = client.chat.completions.create(model="x", max_tokens=40, temperature=0, messages=[
        {"role": "system", "content": "One line."}, {"role": "user", "content": ASK}])
    assert texts[0] == texts[1] == texts[2] == chat.choices[0].message.content


def test_text_format_constrains_the_answer_to_a_schema(client):
    schema = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"],
              "additionalProperties": False}
    r = _create(client, max_output_tokens=40, text={"format": {"type": "json_schema", "name": "c", "schema": schema}})
    assert r.status == "completed" and json.loads(r.output_text)["city"] in ("Paris", "Rome")


def test_the_unprefixed_path_serves_too(server):
    r = httpx.post(server.url + "/responses", json={"input": ASK, "max_output_tokens": 4}, timeout=60)
    assert r.status_code == 200 and r.json()["object"] == "response"


def test_llama_servers_telemetry_progress_and_timings_in_the_stream(server):
    """return_progress: response.in_progress events with prompt_progress; timings_per_token: timings on each
    text delta; the completed event carries timings (llama-server's fields on its /responses)."""
    body = {"input": ASK, "max_output_tokens": 8, "stream": True, "timings_per_token": True, "return_progress": True}
    with httpx.stream("POST", server.url + "/responses", json=body, timeout=60) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    progress = [e for e in events if "prompt_progress" in e]
    assert progress and all(e["type"] == "response.in_progress" and e["prompt_progress"]["total"] > 0
                            for e in progress)
    assert progress[-1]["prompt_progress"]["processed"] == progress[-1]["prompt_progress"]["total"]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert deltas and all("predicted_per_second" in e["timings"] for e in deltas)
    assert events[-1]["type"] in ("response.completed", "response.incomplete") and "timings" in events[-1]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


@pytest.mark.parametrize("body, param", [
    ({"input": ASK, "previous_response_id": "resp_abc"}, "previous_response_id"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0].type"),
    ({"input": ASK, "tool_choice": "required"}, "tool_choice"),
    ({"input": ASK, "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": ASK, "reasoning": {"effort": "huge"}}, "reasoning.effort"),
    ({"input": ASK, "text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"input": ASK, "speculative": {"draft_max": "many"}}, "speculative.draft_max"),
    ({"input": ASK, "id_slot": -5}, "id_slot"),  # read here as on every API, not ignored
])
def test_refusals_name_the_field_in_openais_shape(server, body, param):
    r = httpx.post(server.url + "/v1/responses", json={"model": "x", **body}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_previous_response_id_is_refused_with_what_to_send_instead(client):
    with pytest.raises(openai.BadRequestError) as e:
        _create(client, previous_response_id="resp_123", store=True)
    assert "send the whole conversation" in e.value.body["message"]


def test_reasoning_effort_is_accepted(client):
    r = _create(client, reasoning={"effort": "low"})
    assert r.reasoning.effort == "low" and r.output_text


def test_the_trace_extension_covers_the_text_whole_and_streamed(client):
    """speculative.trace (docs/webui.md): who produced each token, through the Responses shapes too."""
    extra = {"speculative": {"mode": "draft", "trace": True}}
    whole = _create(client, extra_body=extra)
    trace = whole.model_extra["speculative_trace"]
    assert "".join(e["text"] for e in trace) == whole.output_text
    assert {e["source"] for e in trace} <= {"draft", "target"}
    deltas = [e for e in _create(client, stream=True, extra_body=extra) if e.type == "response.output_text.delta"]
    assert deltas and all("".join(x["text"] for x in e.model_extra["speculative_trace"]) == e.delta for e in deltas)
