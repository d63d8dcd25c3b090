"""Reading tool calls back from generated text (server/core/constraints/toolcalls.py), whole and streamed."""
from __future__ import annotations

import json

import pytest

from specserve.server.apis.openai_chat import delta
from specserve.server.core.constraints.toolcalls import CallReader, answer
from specserve.server.core.constraints.tools import CallForm

SPECIAL, PLAIN = CallForm(special=True), CallForm(special=False)


def call(name: str, arguments: dict) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


TWO = call("get_weather", {"city": "Paris", "when": {"day": 1}}) + "\n" + call("get_time", {})


@pytest.mark.parametrize("form,text,content,calls,reason", [
    (SPECIAL, "just text", "just text", [], "stop"),
    (SPECIAL, TWO, None, [("get_weather", {"city": "Paris", "when": {"day": 1}}), ("get_time", {})], "tool_calls"),
    (SPECIAL, "Let me look.\n" + call("f", {"a": "}\n</tool_call"}), "Let me look.",
     [("f", {"a": "}\n</tool_call"})], "tool_calls"),  # not the suffix: inside a JSON string
    (PLAIN, call("f", {"x": [1, 2]}), None, [("f", {"x": [1, 2]})], "tool_calls"),
    (PLAIN, "text, then " + call("f", {}), "text, then " + call("f", {}), [], "stop"),  # a call only at the start
], ids=["text", "two-calls", "content-then-call", "plain-tags", "plain-tag-later-is-text"])
def test_a_whole_answer(form, text, content, calls, reason):
    message, finish, cut = answer(form, text, "stop")
    assert message["content"] == content and finish == reason and cut is None
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls", [])]
    assert got == calls
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in message.get("tool_calls", []))


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_streamed_deltas_add_up_to_the_whole_answer(size):
    """However the text is split, the deltas give what the whole answer gives: content, then per call
    one delta with id, type and name and arguments fragments that join to the arguments."""
    text = "Checking.\n" + TWO
    reader, deltas = CallReader(SPECIAL), []
    for i in range(0, len(text), size):
        deltas += [delta(p) for p in reader.feed(text[i:i + size])]
    deltas += [delta(p) for p in reader.close()]
    content = "".join(d.get("content", "") for d in deltas)
    calls: dict[int, dict] = {}
    for d in deltas:
        for tc in d.get("tool_calls", []):
            if "id" in tc:
                assert tc["index"] not in calls and tc["type"] == "function"
                calls[tc["index"]] = {"name": tc["function"]["name"], "arguments": ""}
            calls[tc["index"]]["arguments"] += tc["function"]["arguments"]
    whole, _, _ = answer(SPECIAL, text, "stop")
    assert content.rstrip() == whole["content"]
    assert [calls[i] for i in sorted(calls)] == [c["function"] for c in whole["tool_calls"]]


def test_a_call_cut_by_max_tokens_says_so():
    message, finish, cut = answer(SPECIAL, TWO[:60], "length")  # cut inside the first arguments
    assert finish == "length"
    assert message["tool_calls"][0]["function"]["name"] == "get_weather"
    assert "get_weather" in cut and "not complete JSON" in cut
    _, finish, cut = answer(SPECIAL, "<tool_call>\n{\"na", "length")
    assert finish == "length" and "before its function name" in cut


def test_finish_detail_states_why_an_answer_ended():
    from specserve.server.core.answer import finish_detail
    from specserve.stats import GenerationStats

    assert finish_detail(GenerationStats(finish_reason="stop")) == {}
    dead = GenerationStats(finish_reason="stop", grammar_error="the grammar allows no token here (dead end)")
    assert "dead end" in finish_detail(dead)["finish_detail"]
    cut = finish_detail(GenerationStats(finish_reason="length"), "tool call 0 (f) was cut")
    assert cut == {"finish_detail": "tool call 0 (f) was cut when max_tokens ended the answer"}
