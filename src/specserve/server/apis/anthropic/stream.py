"""A /v1/messages answer as Anthropic's stream of named server-sent events.

    message_start (the message, no content, the prompt's usage)   ping
    content_block_start (index i, the block)   content_block_delta* (thinking_delta | text_delta |
    input_json_delta)   content_block_stop (index i)   ... one block after another: the reasoning as a
    thinking block (signed with an empty signature_delta before it stops), text, then each tool_use
    message_delta (stop_reason, stop_sequence, usage with output_tokens and `speculative`)   message_stop

Blocks are numbered from 0 in the order they open; one is open at a time. Where tool calls are read
back, blank text is held until it is known whether a call follows it (then it is dropped, as in the
whole answer) or text (then it opens the text block). Each event is written as `event: TYPE` and its
JSON (`write`); an error after the headers is Anthropic's `event: error`.
"""
from __future__ import annotations

import json
from typing import AsyncIterator

from ...core.answer import events as answer_events
from ...core.answer import speculative_usage
from ...core.events import CallArguments, CallStart, Finish, ReasoningText, Text
from ...core.jobs import Job

STOP_REASONS = {"tool_calls": "tool_use", "length": "max_tokens"}  # else end_turn (or stop_sequence)


def stop_reason(reason: str, stop_word: str) -> str:
    """Anthropic's stop_reason for a finish reason (and the stop string that ended the text, if one did)."""
    return STOP_REASONS.get(reason) or ("stop_sequence" if stop_word else "end_turn")


def usage(job: Job) -> dict:
    """Anthropic's usage: input_tokens not read from the slot's cache, those that were, output tokens,
    and what speculation did."""
    s = job.stats
    return {"input_tokens": s.n_prompt - s.n_cached, "cache_read_input_tokens": s.n_cached,
            "output_tokens": s.n_generated, "speculative": speculative_usage(job)}


def write(obj: dict) -> str:
    """One named event: `event: message_start` then its data (an error body's type is "error")."""
    return f"event: {obj['type']}\ndata: {json.dumps(obj, ensure_ascii=False)}\n\n"


class _Blocks:
    """The content blocks opened so far: index of the open one and its kind."""

    def __init__(self):
        self.count = 0
        self.open: str | None = None

    def start(self, block: dict) -> list[dict]:
        out = self.stop()
        self.open = block["type"]
        self.count += 1
        return out + [{"type": "content_block_start", "index": self.count - 1, "content_block": block}]

    def delta(self, delta: dict, **extra) -> dict:
        return {"type": "content_block_delta", "index": self.count - 1, "delta": delta, **extra}

    def stop(self) -> list[dict]:
        if self.open is None:
            return []
        out = []
        if self.open == "thinking":  # Anthropic's clients expect a signature before a thinking block ends
            out.append(self.delta({"type": "signature_delta", "signature": ""}))
        self.open = None
        return out + [{"type": "content_block_stop", "index": self.count - 1}]


async def events(job: Job, head: dict) -> AsyncIterator[dict]:
    """The stream's events (see the module docstring); `head`: the message's id, type, role and model."""
    s = job.stats
    yield {"type": "message_start", "message": {
        **head, "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": s.n_prompt - s.n_cached, "cache_read_input_tokens": s.n_cached, "output_tokens": 0}}}
    yield {"type": "ping"}
    blocks, held, calls = _Blocks(), "", 0
    hold_blank = job.req.reads_calls
    async for event in answer_events(job):
        kind = type(event)
        if kind is Text:
            text = event.text
            if blocks.open != "text":
                text, held = held + text, ""
                if not text or hold_blank and not text.strip():
                    held = text
                    continue
                for e in blocks.start({"type": "text", "text": ""}):
                    yield e
            if text:
                extra = {"speculative_trace": event.trace} if event.trace is not None else {}
                yield blocks.delta({"type": "text_delta", "text": text}, **extra)
        elif kind is ReasoningText:  # the answer's reasoning block comes first: a thinking block
            if event.text:
                if blocks.open != "thinking":
                    for e in blocks.start({"type": "thinking", "thinking": ""}):
                        yield e
                extra = {"speculative_trace": event.trace} if event.trace is not None else {}
                yield blocks.delta({"type": "thinking_delta", "thinking": event.text}, **extra)
        elif kind is CallStart:
            held, calls = "", calls + 1
            for e in blocks.start({"type": "tool_use", "id": event.id, "name": event.name, "input": {}}):
                yield e
        elif kind is CallArguments:
            yield blocks.delta({"type": "input_json_delta", "partial_json": event.text})
        elif kind is Finish:
            cut = event.cut if event.reason == "length" else None  # a call max_tokens cut: an incomplete tool_use
            if held and not calls and cut is None:  # blank text and no call after it: the answer is that text
                for e in blocks.start({"type": "text", "text": ""}):
                    yield e
                yield blocks.delta({"type": "text_delta", "text": held})
            if cut is not None:
                for e in blocks.start({"type": "tool_use", "id": cut.id, "name": cut.name, "input": {}}):
                    yield e
                if cut.arguments:
                    yield blocks.delta({"type": "input_json_delta", "partial_json": cut.arguments})
            for e in blocks.stop():
                yield e
            stop_word = event.stats.stop_word
            yield {"type": "message_delta", "delta": {"stop_reason": stop_reason(event.reason, stop_word),
                                                      "stop_sequence": stop_word or None},
                   "usage": usage(job), **event.detail}
    yield {"type": "message_stop"}
