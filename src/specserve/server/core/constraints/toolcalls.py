"""Generated text -> tool calls, whole or as stream events.

Calls come in two spellings. The template's: the grammar (tools.py) makes the text `[content]
<tool_call>\\n{"name": "N", "arguments": ARGS}\\n</tool_call>` (calls joined by newlines), read
as the open tag, the name up to its closing quote, the arguments up to the suffix
`}\\n</tool_call>`. And a declared tool's call written as JSON at a line's start, bare or fenced
(textcalls.py), which small models write under tool_choice "auto", and which is Llama 3.x's own form
(`{"name": ..., "parameters": ...}`). The generic form has its own reader (genericcalls.py).

The reader reads text as it streams and gives back events (events.py) that are final: content
as soon as it cannot be a call's start (text that may be one waits), and each call whole, once it
is complete (CallStart with its id and name, then CallArguments with all its arguments). So a call
cut by max_tokens is never handed out: it is dropped, and `cut()` says so (the answer's
`finish_detail`). A call identical to one already made (same function, same arguments) ends the
calls, as does a second call where the request allows one (`parallel_tool_calls: false`): `ended`
is set, and the answer (answer.py) stops generating. A whole answer reads back as an assistant
message in the chat form the templates take (OpenAI's, which `GenRequest.messages` holds).
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from ..events import CallArguments, CallStart, Event, Text
from .textcalls import CALL, NO, PARTIAL, match
from .tools import CallForm

_BLANKS = " \t\r\n"


def call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class Call:
    id: str
    name: str
    arguments: str = ""

    def message(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def _held(buffer: str, marker: str) -> int:
    """How many characters at the end of `buffer` could begin `marker` (and so must wait)."""
    for k in range(min(len(marker) - 1, len(buffer)), 0, -1):
        if marker.startswith(buffer[-k:]):
            return k
    return 0


def _canonical(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), sort_keys=True)
    except ValueError:
        return arguments


@dataclass
class CallReader:
    """Feed text as it comes; get back events: Text for content, CallStart + CallArguments per
    complete call. `names`: the declared tools (calls written as JSON name one); `parallel`: more
    than one call allowed."""

    form: CallForm
    names: tuple[str, ...] = ()
    parallel: bool = True
    calls: list[Call] = field(default_factory=list)
    content: str = ""  # the text outside calls
    ended: bool = False  # a repeated call (or one too many) ended the calls: read nothing more
    _buf: str = ""
    _tag: bool = False  # the buffer starts with the open tag: a call in the template's form
    _line_start: bool = True  # the buffer starts a line (or the answer)
    _after_call: bool = False  # only blanks since the last call
    _cut: str | None = None
    # the call cut short, where its name was whole: its arguments as far as they came (the APIs that report a
    # cut call, Anthropic's and the Responses API, show it as an incomplete tool_use / function_call)
    cut_call: Call | None = None

    @classmethod
    def for_tools(cls, tools) -> "CallReader":
        """The reader of a request's ToolRequest (tools.py)."""
        return cls(tools.form, tools.names, tools.parallel)

    def feed(self, text: str) -> list[Event]:
        out: list[Event] = []
        if self.ended or self._cut:
            return out
        self._buf += text
        while not self.ended and self._step(out, False):
            pass
        return out

    def close(self) -> list[Event]:
        """At the end of generation: what still waited is content, or a call cut short (dropped)."""
        out: list[Event] = []
        while not self.ended and not self._cut and self._step(out, True):
            pass
        if not self.ended and not self._cut and self._buf:
            self._content(self._buf, out)
        self._buf = ""
        return out

    def _step(self, out: list[Event], final: bool) -> bool:
        """Advance if the buffer allows; False when it must wait for more text (or, final, is done)."""
        return self._in_tag(out, final) if self._tag else self._in_content(out, final)

    def _in_content(self, out: list[Event], final: bool) -> bool:
        buf, f = self._buf, self.form
        if self._after_call:  # blanks between calls are not content
            buf = self._buf = buf.lstrip(_BLANKS)
            if not buf:
                return False
            self._after_call = False
        if f.kind != "tags":  # Llama 3.x's bare JSON: its calls are read as calls written in the text
            at, held = -1, 0
        elif f.special:
            at, held = buf.find(f.open), _held(buf, f.open)
        elif not self.content and not self.calls:  # a plain-text tag opens a call only at the start (the grammar's)
            at, held = (0 if buf.startswith(f.open) else -1), (len(buf) if f.open.startswith(buf) else 0)
        else:
            at, held = -1, 0
        stop = at if at >= 0 else len(buf) - (0 if final else held)
        starts = ([0] if self._line_start else []) + [i + 1 for i, c in enumerate(buf[:stop]) if c == "\n"]
        for p in starts:
            m = match(buf, p, self.names, final) if self.names else None
            if m is None or m.status == NO or m.status == PARTIAL and final and m.name is None:
                continue
            self._content(buf[:p], out)
            if m.status == CALL:
                self._buf = buf[m.end:]
                self._finish(m.name, _layout(m.arguments), out)
                return True
            if final:  # a call begun (its name declared and whole) and cut short
                self._dropped(m.name)
            self._buf = buf[p:]
            return False
        self._content(buf[:stop], out)
        self._buf = buf[stop:]
        if at >= 0:
            self._tag = True
            return True
        return False

    def _in_tag(self, out: list[Event], final: bool) -> bool:
        f, rest = self.form, self._buf[len(self.form.open):]
        if not rest.startswith(f.prefix):
            return self._wait(None, final)
        end = rest.find(f.middle, len(f.prefix))
        if end < 0:
            return self._wait(None, final)
        name, start = rest[len(f.prefix):end], end + len(f.middle)
        close = rest.find(f.suffix, start)
        if close < 0:
            return self._wait(name, final, rest[start:])
        self._buf, self._tag = rest[close + len(f.suffix):], False
        self._finish(name, rest[start:close], out)
        return True

    def _wait(self, name: str | None, final: bool, arguments: str = "") -> bool:
        if final:
            self._dropped(name, arguments)
        return False

    def _dropped(self, name: str | None, arguments: str = "") -> None:
        if name:
            self.cut_call = Call(call_id(), name, arguments)
        n = len(self.calls)
        self._cut = (f"tool call {n} ({name}) was cut before its arguments were complete and is left out"
                     if name else f"tool call {n} was cut before its function name was complete and is left out")
        self._buf = ""

    def _finish(self, name: str, arguments: str, out: list[Event]) -> None:
        """A complete call: handed out, unless it repeats one (or one call is all that is allowed)."""
        key = (name, _canonical(arguments))
        if any((c.name, _canonical(c.arguments)) == key for c in self.calls) or self.calls and not self.parallel:
            self.ended, self._buf = True, ""
            return
        self.calls.append(Call(call_id(), name, arguments))
        index = len(self.calls) - 1
        out += [CallStart(index, self.calls[-1].id, name), CallArguments(index, arguments)]
        self._after_call, self._line_start = True, True

    def _content(self, text: str, out: list[Event]) -> None:
        if text:
            self.content += text
            self._line_start = text.endswith("\n")
            out.append(Text(text))

    @property
    def on_call(self) -> bool:
        """Whether the answer ended on calls: nothing but blanks after the last complete one."""
        return bool(self.calls) and (self.ended or self._after_call and not self._buf.strip(_BLANKS))

    def cut(self) -> str | None:
        """The call cut short when generation ended, in words (None if none was)."""
        return self._cut

    def message(self) -> dict:
        """The assistant message: content (None when empty) and tool_calls (when any)."""
        content = self.content.strip(_BLANKS) if self.calls else self.content.rstrip()
        msg = {"role": "assistant", "content": content or None}
        if self.calls:
            msg["tool_calls"] = [c.message() for c in self.calls]
        return msg


def _layout(arguments: str) -> str:
    """A call written as JSON in the text, its arguments in the layout of the template's form (json.dumps's)."""
    try:
        return json.dumps(json.loads(arguments), ensure_ascii=False)
    except ValueError:
        return arguments


def finish(reader: CallReader, reason: str) -> str:
    """The finish reason: "tool_calls" when the answer ended on complete calls (nothing cut, nothing
    after them; a repeated call ends them too), else the engine's."""
    if reader.calls and reader.cut() is None and (reason == "stop" or reader.ended) and reader.on_call:
        return "tool_calls"
    return reason


def answer(form: CallForm, text: str, reason: str, names: tuple[str, ...] = (),
           parallel: bool = True) -> tuple[dict, str, str | None]:
    """A whole answer: the assistant message, the finish_reason, and what was cut (if anything)."""
    reader = CallReader(form, names, parallel)
    reader.feed(text)
    reader.close()
    return reader.message(), finish(reader, reason), reader.cut()
