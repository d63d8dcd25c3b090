"""Reading tool calls back from generated text (server/core/constraints/toolcalls.py), whole and streamed."""
from __future__ import annotations

import json

import pytest

from specserve.server.apis.openai.chat import delta
from specserve.server.core.constraints.toolcalls import CallReader, answer, finish
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


def test_a_call_cut_by_max_tokens_is_left_out_and_said():
    message, finish, cut = answer(SPECIAL, TWO[:60], "length")  # cut inside the first arguments
    assert finish == "length" and "tool_calls" not in message and message["content"] is None
    assert "get_weather" in cut and "left out" in cut
    message, finish, cut = answer(SPECIAL, TWO[:-10], "length")  # the second call cut: the first stays
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather"]
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris", "when": {"day": 1}}
    assert finish == "length" and "get_time" in cut
    _, finish, cut = answer(SPECIAL, "<tool_call>\n{\"na", "length")
    assert finish == "length" and "before its function name" in cut


@pytest.mark.parametrize("size", [1, 5, 1000])
def test_a_streamed_call_comes_whole_and_a_cut_one_never(size):
    """No event of a call before it is complete: a client never holds arguments that are not JSON."""
    reader, events = CallReader(SPECIAL), []
    for i in range(0, len(TWO) - 10, size):
        events += reader.feed(TWO[:-10][i:i + size])
    events += reader.close()
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["CallStart", "CallArguments"], kinds
    assert json.loads(events[1].text) == {"city": "Paris", "when": {"day": 1}} and reader.cut()


def test_a_repeated_call_ends_the_calls():
    """The same function with the same arguments again (layout aside) ends the answer: tool_calls."""
    again = call("get_weather", {"when": {"day": 1}, "city": "Paris"})  # the same arguments, keys reordered
    reader = CallReader(SPECIAL)
    reader.feed(TWO.split("\n<tool_call>")[0] + "\n" + again + "\n" + call("get_time", {}))
    reader.close()
    assert reader.ended and [c.name for c in reader.calls] == ["get_weather"]
    assert finish(reader, "length") == "tool_calls"  # ended on its calls, whatever came after


def test_a_second_call_where_one_is_allowed_ends_the_calls():
    message, finish_reason, _ = answer(SPECIAL, TWO, "stop", parallel=False)
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather"]
    assert finish_reason == "tool_calls"


def test_finish_detail_states_why_an_answer_ended():
    from specserve.server.core.answer import finish_detail
    from specserve.stats import GenerationStats

    assert finish_detail(GenerationStats(finish_reason="stop")) == {}
    dead = GenerationStats(finish_reason="stop", grammar_error="the grammar allows no token here (dead end)")
    assert "dead end" in finish_detail(dead)["finish_detail"]
    cut = finish_detail(GenerationStats(finish_reason="length"), "tool call 0 (f) was cut")
    assert cut == {"finish_detail": "tool call 0 (f) was cut when max_tokens ended the answer"}


# --- calls written as JSON in the text (textcalls.py) ---------------------------------------------------

NAMES = ("get_forecast", "get_time")
FENCED = ('```json\n{\n  "name": "get_forecast",\n  "arguments": {\n    "city": "Lyon",\n    "days": 3\n  }\n}\n```')
LYON = ("get_forecast", {"city": "Lyon", "days": 3})


@pytest.mark.parametrize("text,content,calls", [
    (FENCED, None, [LYON]),
    ("Let me check.\n" + FENCED, "Let me check.", [LYON]),
    ('{"name": "get_time", "parameters": {}}', None, [("get_time", {})]),
    ('  ```\n  {"name":"get_forecast","arguments":{"city":"Lyon","days":3}}```', None, [LYON]),
    (FENCED + "\n" + FENCED.replace("Lyon", "Oslo"), None, [LYON, ("get_forecast", {"city": "Oslo", "days": 3})]),
    ('Call {"name": "get_forecast", "arguments": {}} to know.', 'Call {"name": "get_forecast", "arguments": {}} to '
     'know.', []),
    ('{"name": "get_weather", "arguments": {"city": "Lyon"}}', '{"name": "get_weather", "arguments": {"city": '
     '"Lyon"}}', []),
    ('```json\n{"name": "get_forecast", "id": 3}\n```', '```json\n{"name": "get_forecast", "id": 3}\n```', []),
    ("```python\nprint({'name': 1})\n```", "```python\nprint({'name': 1})\n```", []),
], ids=["fenced", "text-then-fenced", "bare-parameters", "fence-without-language", "two-fenced", "mentioned",
        "undeclared", "not-a-call-shape", "other-code"])
def test_a_call_written_in_the_text(text, content, calls):
    message, finish_reason, cut = answer(SPECIAL, text, "stop", NAMES)
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls", [])]
    assert (message["content"], got, cut) == (content, calls, None)
    assert finish_reason == ("tool_calls" if calls else "stop")
    for c in message.get("tool_calls", []):  # in the template's layout, as a call in its own form
        assert c["function"]["arguments"] == json.dumps(json.loads(c["function"]["arguments"]))


@pytest.mark.parametrize("text", ["Let me check.\n" + FENCED, "Result:\n{\"value\": 3}\nDone.", "x {\"name\": 1}"])
def test_text_waits_only_while_it_may_be_a_call(text):
    """Fed a character at a time, content comes out as soon as it cannot begin a call; what waits is
    only a line that may still be one."""
    reader, content = CallReader(SPECIAL, NAMES), ""
    for i, ch in enumerate(text):
        content += "".join(e.text for e in reader.feed(ch) if type(e).__name__ == "Text")
        fed = text[:i + 1]
        line = fed.rfind("\n") + 1
        assert fed.startswith(content)
        waiting = fed[len(content):]
        if "```json" not in fed:  # no call in sight: only the current line (if a call's possible start) waits
            assert waiting in ("", fed[line:]) and (not waiting or '"value"' not in waiting)
    content += "".join(e.text for e in reader.close() if type(e).__name__ == "Text")
    whole, _, _ = answer(SPECIAL, text, "stop", NAMES)
    assert content.strip() == (whole["content"] or "")


def test_a_call_written_in_the_text_and_cut_is_left_out():
    message, finish_reason, cut = answer(SPECIAL, "Sure.\n" + FENCED[:60], "length", NAMES)
    assert message == {"role": "assistant", "content": "Sure."} and finish_reason == "length"
    assert "get_forecast" in cut and "left out" in cut
    message, _, cut = answer(SPECIAL, 'Sure.\n{"name": "get_fore', "length", NAMES)  # no declared name yet: text
    assert message["content"] == 'Sure.\n{"name": "get_fore' and cut is None
