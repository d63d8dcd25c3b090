"""Tools on SmolLM2-135M (F16, its Q4_1 as the draft), whose ChatML template has no tool support: the
generic form (server/core/constraints/generic.py) describes the tool in the system message and the
model, greedy and under tool_choice "auto", calls it with the city asked about, whole, streamed and on
/v1/messages (llama.cpp's test_anthropic_tool_use_basic asks this of llama-server)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from server_fixtures import ServerProcess  # noqa: E402

pytestmark = [pytest.mark.server, pytest.mark.real_models]

WEATHER = {"type": "object", "properties": {"location": {"type": "string", "description": "City name"}},
           "required": ["location"]}
ASK = [{"role": "user", "content": "What's the weather in Paris?"}]


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    from specserve import models

    d = tmp_path_factory.mktemp("smollm2_tools")
    srv = ServerProcess(["-m", models.ensure("smollm2-f16"), "-md", models.ensure("smollm2-q4_1"), "-c", "2048",
                         "--parallel", "1"], d / "serve.log")
    try:
        with httpx.Client(base_url=srv.url, timeout=300) as client:
            yield client
    finally:
        assert srv.stop() == 0
        assert "tool calls: generic JSON" in srv.log()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_smollm2_calls_the_tool_for_the_city_asked_about(http, stream):
    tool = {"type": "function", "function": {"name": "get_weather",
                                             "description": "Get the current weather in a location",
                                             "parameters": WEATHER}}
    r = http.post("/v1/chat/completions", json={"messages": ASK, "tools": [tool], "tool_choice": "auto",
                                                 "max_tokens": 100, "temperature": 0, "stream": stream})
    assert r.status_code == 200, r.text
    if stream:
        chunks = [json.loads(ln[6:]) for ln in r.text.splitlines() if ln.startswith("data: {")]
        deltas = [c["choices"][0]["delta"] for c in chunks if c.get("choices")]
        calls = [tc["function"] for d in deltas for tc in d.get("tool_calls") or []]
        name, arguments = calls[0]["name"], "".join(c.get("arguments") or "" for c in calls)
        assert not "".join(d.get("content") or "" for d in deltas)
        finish = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")][-1]
    else:
        message = r.json()["choices"][0]["message"]
        call = message["tool_calls"][0]["function"]
        name, arguments = call["name"], call["arguments"]
        finish = r.json()["choices"][0]["finish_reason"]
    assert (name, json.loads(arguments), finish) == ("get_weather", {"location": "Paris"}, "tool_calls")


def test_smollm2_answers_anthropic_tool_use(http):
    r = http.post("/v1/messages", json={"model": "smollm2", "max_tokens": 100, "temperature": 0, "messages": ASK,
                                        "tools": [{"name": "get_weather", "description": "Get the current weather "
                                                   "in a location", "input_schema": WEATHER}]})
    assert r.status_code == 200, r.text
    assert r.json()["stop_reason"] == "tool_use"
    assert [(b["type"], b["name"], b["input"]) for b in r.json()["content"]] == [
        ("tool_use", "get_weather", {"location": "Paris"})]
