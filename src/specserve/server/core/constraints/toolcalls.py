"""Generated text in a template's call form -> tool calls, whole or as stream events.

The grammar (tools.py) makes the text `[content] <tool_call>\\n{"name": "N", "arguments":
ARGS}\\n</tool_call>` (calls joined by newlines), so reading it back is a small state machine:
content until the open tag, the name up to its closing quote, then the arguments until the
suffix `}\\n</tool_call>`. It reads text as it streams, holding back only what might still turn
out to be a tag or the suffix, so that each event (events.py) is final: the content before a call,
a call's id and name once the name is complete, then its arguments in fragments. A whole answer
reads back as an assistant message in the chat form the templates take (OpenAI's, which
`GenRequest.messages` holds).
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from ..events import CallArguments, CallStart, Event, Text
from .tools import CallForm


def call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class Call:
    id: str
    name: str
    arguments: str = ""
    complete: bool = False

    def message(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def _held(buffer: str, marker: str) -> int:
    """How many characters at the end of `buffer` could begin `marker` (and so must wait)."""
    for k in range(min(len(marker) - 1, len(buffer)), 0, -1):
        if marker.startswith(buffer[-k:]):
            return k
    return 0


@dataclass
class CallReader:
    """Feed text as it comes; get back events: Text for content, CallStart when a call's name is
    known, CallArguments for each fragment of its arguments."""

    form: CallForm
    calls: list[Call] = field(default_factory=list)
    content: str = ""  # the content so far (before the first call)
    _buf: str = ""
    _state: str = "content"  # content, prefix, name, arguments, between

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        out: list[Event] = []
        while self._step(out):
            pass
        return out

    def _step(self, out: list[Event]) -> bool:
        """Advance one state if the buffer allows; False when it must wait for more text."""
        f, buf = self.form, self._buf
        if self._state in ("content", "between"):
            at = buf.find(f.open)
            if at > 0 and not f.special and self._state == "content" or not f.special and self.content:
                at = -1  # a plain-text tag is a call only at the start (the grammar's rule); later it is text
            if at < 0:
                keep = _held(buf, f.open)
                if self._state == "content":
                    self._content(buf[:len(buf) - keep], out)
                self._buf = buf[len(buf) - keep:]
                return False
            if self._state == "content":
                self._content(buf[:at], out)
            self._buf, self._state = buf[at + len(f.open):], "prefix"
            return True
        if self._state == "prefix":
            if len(buf) < len(f.prefix):
                return False
            self._buf, self._state = buf[len(f.prefix):], "name"
            return True
        if self._state == "name":
            end = buf.find(f.middle)
            if end < 0:
                return False
            self.calls.append(Call(call_id(), buf[:end]))
            out.append(CallStart(len(self.calls) - 1, self.calls[-1].id, self.calls[-1].name))
            self._buf, self._state = buf[end + len(f.middle):], "arguments"
            return True
        # arguments: everything up to the suffix, holding back what may be its start
        call, index = self.calls[-1], len(self.calls) - 1
        end = buf.find(f.suffix)
        if end < 0:
            keep = _held(buf, f.suffix)
            self._arguments(call, index, buf[:len(buf) - keep], out)
            self._buf = buf[len(buf) - keep:]
            return False
        self._arguments(call, index, buf[:end], out)
        call.complete = True
        self._buf, self._state = buf[end + len(f.suffix):], "between"
        return True

    def _content(self, text: str, out: list[Event]) -> None:
        if text:
            self.content += text
            out.append(Text(text))

    @staticmethod
    def _arguments(call: Call, index: int, text: str, out: list[Event]) -> None:
        if text:
            call.arguments += text
            out.append(CallArguments(index, text))

    def close(self) -> list[Event]:
        """At the end of generation: the pieces still held back (a tag's start that never completed
        in content, an argument fragment that might have been the suffix's start)."""
        out: list[Event] = []
        if self._state == "content":
            self._content(self._buf, out)
        elif self._state == "arguments":
            self._arguments(self.calls[-1], len(self.calls) - 1, self._buf, out)
        self._buf = ""
        return out

    def cut(self) -> str | None:
        """What was left incomplete when generation ended, in words (None if nothing was)."""
        if self._state in ("content", "between"):
            return None
        if self._state in ("prefix", "name"):
            return f"tool call {len(self.calls)} was cut before its function name was complete"
        call = self.calls[-1]
        return (f"tool call {len(self.calls) - 1} ({call.name}) was cut: its arguments are not complete JSON "
                f"({len(call.arguments)} characters)")

    def message(self) -> dict:
        """The assistant message: content (None when empty) and tool_calls (when any)."""
        content = self.content.rstrip()
        msg = {"role": "assistant", "content": content or None}
        if self.calls:
            msg["tool_calls"] = [c.message() for c in self.calls]
        return msg


def finish(reader: CallReader, reason: str) -> str:
    """The finish reason: "tool_calls" when the answer ended on its own after a complete call."""
    return "tool_calls" if reason == "stop" and reader.calls and reader.cut() is None else reason


def answer(form: CallForm, text: str, reason: str) -> tuple[dict, str, str | None]:
    """A whole answer: the assistant message, the finish_reason, and what was cut (if anything)."""
    reader = CallReader(form)
    reader.feed(text)
    reader.close()
    return reader.message(), finish(reader, reason), reader.cut()
