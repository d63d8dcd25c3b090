"""An answer in the generic form (generic.py) -> content or tool calls, whole or as stream events.

The grammar makes the answer `{"response": "..."}`, `{"tool_call": CALL}` or `{"tool_calls": [CALL,
...]}`, CALL `{"name": ..., "arguments": {...}}`. The reply's JSON string is decoded as it streams
(an escape waits until it is whole), so a client sees the text, never the JSON around it. Calls
come whole, as from the tags' reader (toolcalls.py): a call cut by max_tokens is dropped and said
in `cut()`; a repeated call, or a second where one is allowed, ends the calls (`ended`). Text that
is not in the form (no grammar held it there) is content as it is.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ..events import Event
from .generic import CALL, CALLS, RESPONSE
from .textcalls import CALL as COMPLETE
from .textcalls import PARTIAL, scan_json
from .toolcalls import CallReader

_OPENINGS = ((RESPONSE + '"', "response"), (CALL, "call"), (CALLS, "calls"))
_NAME = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_HIGH_SURROGATE = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}$")


@dataclass
class GenericReader(CallReader):
    """CallReader's interface over the generic form: feed text, get Text events for the reply and
    CallStart + CallArguments per complete call."""

    _mode: str | None = None  # None: not yet known; "response", "call", "calls", "done"; "text": not the form

    @classmethod
    def for_tools(cls, tools) -> "GenericReader":
        return cls(tools.form, tools.names, tools.parallel)

    def _step(self, out: list[Event], final: bool) -> bool:
        if self._mode is None:
            return self._opening(final)
        if self._mode == "response":
            return self._reply(out, final)
        if self._mode in ("call", "calls"):
            return self._call(out, final)
        if self._mode == "text":
            self._content(self._buf, out)
        self._buf = ""  # "done": what closes the object
        return False

    def _opening(self, final: bool) -> bool:
        for opening, mode in _OPENINGS:
            if self._buf.startswith(opening):
                self._buf, self._mode = self._buf[len(opening):], mode
                return True
        if any(opening.startswith(self._buf) for opening, _ in _OPENINGS):
            if final:  # cut before the object said what it is: no reply, or a call cut before its name
                if self._buf and not (RESPONSE + '"').startswith(self._buf):
                    self._dropped(None)
                self._buf = ""
            return False
        self._mode = "text"
        return True

    def _reply(self, out: list[Event], final: bool) -> bool:
        """The reply's string up to its closing quote, decoded; an escape not yet whole waits (at the
        end it is dropped)."""
        buf, i, closed = self._buf, 0, False
        while i < len(buf):
            if buf[i] == "\\":
                step = 6 if buf[i + 1:i + 2] == "u" else 2
                if i + step > len(buf) or step == 6 and _HIGH_SURROGATE.search(buf[i:i + 6]) and i + 12 > len(buf):
                    break  # a surrogate pair's first half waits for its second
                i += step
            elif buf[i] == '"':
                closed = True
                break
            else:
                i += 1
        try:
            text = json.loads('"' + buf[:i] + '"')
        except ValueError:
            text = buf[:i]
        self._content(text, out)
        self._buf = buf[i + 1:] if closed else buf[i:]
        if closed:
            self._mode = "done"
            return True
        if final:
            self._buf = ""
        return False

    def _call(self, out: list[Event], final: bool) -> bool:
        buf = self._buf.lstrip(" \t\r\n,") if self._mode == "calls" else self._buf
        if self._mode == "calls" and buf.startswith("]"):
            self._buf, self._mode = "", "done"
            return True
        if not buf:
            return False
        status, end = scan_json(buf, 0)
        if status != COMPLETE:
            if final or status != PARTIAL:
                name = _NAME.match(buf)
                self._dropped(json.loads(f'"{name.group(1)}"') if name else None)
            return False
        try:
            item = json.loads(buf[:end])
        except ValueError:
            item = None
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            self._dropped(None)
            return False
        self._buf = buf[end:]
        self._finish(item["name"], json.dumps(item.get("arguments", {}), ensure_ascii=False), out)
        if self._mode == "call":
            self._mode = "done"
        return True

    @property
    def on_call(self) -> bool:
        """Whether the answer ended on calls: the object closed after them (or a repeat ended them)."""
        return bool(self.calls) and (self.ended or self._mode in ("done", "calls"))
