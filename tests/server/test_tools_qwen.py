"""Tool calls on the reference pair (Qwen2.5-Coder 1.5B F16 + 0.5B draft), greedy, speculation on: the
weather example of issues 48 and 50. Under "auto" the model writes its call as fenced JSON in the text,
which comes back as a call; under "required" the answer ends after one complete call instead of running
on to max_tokens and handing out a cut one."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from server_fixtures import ServerProcess, chat  # noqa: E402

pytestmark = [pytest.mark.server, pytest.mark.real_models]

FORECAST = {"type": "function", "function": {
    "name": "get_forecast", "description": "Weather forecast for a city, day by day",
    "parameters": {"type": "object", "required": ["city", "days", "unit"], "properties": {
        "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}}
ASK = [{"role": "user", "content": "Will I need an umbrella in Lyon over the next three days? Use Fahrenheit."}]
BODY = {"messages": ASK, "tools": [FORECAST], "max_tokens": 120, "temperature": 0}
LYON = {"city": "Lyon", "days": 3, "unit": "fahrenheit"}


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    from specserve import models

    d = tmp_path_factory.mktemp("qwen_tools")
    srv = ServerProcess(["-m", models.ensure("qwen2.5-coder-1.5b-f16"), "-md", models.ensure("qwen2.5-coder-0.5b"),
                         "-c", "2048", "--parallel", "1"], d / "serve.log")
    try:
        with httpx.Client(base_url=srv.url, timeout=900) as client:  # the 1.5B F16 on 2 cores: minutes a request
            yield client
    finally:
        assert srv.stop() == 0


def test_a_call_written_as_fenced_json_under_auto_is_a_call(http):
    choice = chat(http, BODY, tool_choice="auto")["choices"][0]
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_forecast" and json.loads(call["function"]["arguments"]) == LYON
    assert choice["finish_reason"] == "tool_calls" and not choice["message"]["content"]


def test_the_streamed_call_is_the_same_call(http):
    calls, content, finish = {}, "", None
    with http.stream("POST", "/v1/chat/completions", json={**BODY, "tool_choice": "auto", "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    content += choice["delta"].get("content") or ""
                    for tc in choice["delta"].get("tool_calls") or []:
                        calls.setdefault(tc["index"], {"name": tc["function"].get("name"), "arguments": ""})
                        calls[tc["index"]]["arguments"] += tc["function"].get("arguments") or ""
                    finish = choice["finish_reason"] or finish
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [("get_forecast", LYON)]
    assert finish == "tool_calls" and not content.strip()


def test_a_required_call_ends_after_one_complete_call(http):
    """Issue 50's example: four calls came back, the 4th with arguments `{"city`; now the first, complete."""
    choice = chat(http, BODY, tool_choice="required")["choices"][0]
    (call,) = choice["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == LYON and choice["finish_reason"] == "tool_calls"


def test_with_parallel_calls_a_repeated_call_ends_them(http):
    """Given room for several, the model calls with fahrenheit, then celsius, then fahrenheit again: the
    repeat ends the answer, and every call handed out is complete."""
    choice = chat(http, BODY, tool_choice="required", parallel_tool_calls=True)["choices"][0]
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in choice["message"]["tool_calls"]]
    assert calls[0] == ("get_forecast", LYON)
    assert len({json.dumps(a, sort_keys=True) for _, a in calls}) == len(calls)
    assert choice["finish_reason"] == "tool_calls", choice
