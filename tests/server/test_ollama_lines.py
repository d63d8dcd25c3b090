"""Ollama's streamed lines (apis/ollama/serving.py) from a made-up answer's events, no model: reasoning as
`thinking`, text as `content`, each tool call in a line of its own once whole (its arguments an object),
then the `done` line with the counts in nanoseconds and `speculative`."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

from specserve.server.apis.ollama import serving
from specserve.server.core.events import CallArguments, CallStart, Finish, ReasoningText, Text
from specserve.stats import GenerationStats

EVENTS = [ReasoningText("let me see"), Text(""), Text("Checking."), CallStart(0, "call_a", "get_weather"),
          CallArguments(0, '{"city": '), CallArguments(0, '"Paris"}'), CallStart(1, "call_b", "get_time"),
          CallArguments(1, "{}")]


def lines(monkeypatch, chat: bool, reason: str = "tool_calls") -> list[dict]:
    stats = GenerationStats(n_prompt=30, n_generated=9, t_prompt=0.5, t_total=2.0)

    async def events(job):
        for e in [*EVENTS, Finish(reason, {}, stats)]:
            yield e

    monkeypatch.setattr(serving, "events", events)
    monkeypatch.setattr(serving, "speculative_usage", lambda job: {"mode": "draft"})
    job = SimpleNamespace(stats=stats)

    async def collect():
        return [x async for x in serving._lines(job, {"model": "m"}, chat, 0)]
    return asyncio.run(collect())


def test_a_chat_stream(monkeypatch):
    out = lines(monkeypatch, chat=True)
    assert [o["message"] for o in out[:-1]] == [
        {"role": "assistant", "content": "", "thinking": "let me see"},
        {"role": "assistant", "content": "Checking."},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"index": 0, "name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"index": 1, "name": "get_time", "arguments": {}}}]}]
    assert not any(o["done"] for o in out[:-1])
    end = out[-1]
    assert (end["done"], end["done_reason"], end["message"]["content"]) == (True, "stop", "")
    assert (end["prompt_eval_count"], end["eval_count"]) == (30, 9)
    assert (end["prompt_eval_duration"], end["eval_duration"]) == (500_000_000, 1_500_000_000)
    assert end["speculative"] == {"mode": "draft"} and end["model"] == "m" and end["created_at"].endswith("Z")


def test_a_generate_stream_ends_by_its_limit(monkeypatch):
    out = lines(monkeypatch, chat=False, reason="length")
    assert out[0] == {**out[0], "response": "", "thinking": "let me see"} and out[1]["response"] == "Checking."
    assert out[-1]["done_reason"] == "length" and out[-1]["response"] == ""


def test_a_whole_answers_calls_have_object_arguments():
    """A call's arguments as an object; `{}` where they are not one (Ollama's clients read a mapping)."""
    from specserve.server.core.constraints.toolcalls import Call
    assert serving._calls([Call("a", "f", '{"x": 1}'), Call("b", "g", "[1]"), Call("c", "h", "")]) == [
        {"function": {"index": 0, "name": "f", "arguments": {"x": 1}}},
        {"function": {"index": 1, "name": "g", "arguments": {}}},
        {"function": {"index": 2, "name": "h", "arguments": {}}}]
