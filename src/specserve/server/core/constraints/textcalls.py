"""Tool calls written in the text: a declared tool's `{"name": ..., "arguments": {...}}` as JSON.

Small local models asked with tool_choice "auto" often skip their template's call tags and write the
call as JSON in the answer (Qwen2.5-Coder 1.5B: a fenced ```json block), which a client would read as
text. A call in that form counts when it starts a line (or the answer), bare or as the only thing in
a fenced block, and names a declared tool:

    ```json
    {"name": "get_forecast", "arguments": {"city": "Lyon", "days": 3}}
    ```

with any blanks between the tokens, `parameters` for `arguments`, the fence's language optional.
Text that only mentions a tool, JSON in the middle of a line, JSON naming an undeclared tool stay
text. The tools grammar (tools.py) takes over from the same point (the declared name and its
closing quote), so the arguments follow the tool's schema; `match` reads it back as text arrives,
saying as soon as it can that a line cannot be such a call, so that the reader holds back no more
than it must.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

NO, PARTIAL, CALL = "no", "partial", "call"
_WS = " \t\r\n"
_KEYS = ('"arguments"', '"parameters"')
_LANG = re.compile(r"[A-Za-z0-9_+-]*")


@dataclass(frozen=True)
class Match:
    """What `match` found: NO (not a call), PARTIAL (a call's possible start: wait for more text),
    or CALL; `end` (CALL: where the call ends, the fence's close included); `name` once declared and
    complete (a call has begun: the grammar took over there); `arguments` (CALL: the JSON text)."""

    status: str
    end: int = 0
    name: str | None = None
    arguments: str = ""


class _Text:
    """A cursor over text that may end early: each expectation says whether the text has it, could
    still have it (the text ends first: PARTIAL), or does not (NO)."""

    def __init__(self, text: str, at: int):
        self.s, self.i = text, at

    def skip(self, chars: str) -> None:
        while self.i < len(self.s) and self.s[self.i] in chars:
            self.i += 1

    @property
    def ended(self) -> bool:
        return self.i >= len(self.s)

    def literal(self, *options: str) -> str | None:
        """Consume the option the text starts with; PARTIAL if the text ends inside one; NO if none."""
        rest = self.s[self.i:]
        for option in options:
            if rest.startswith(option):
                self.i += len(option)
                return option
        return PARTIAL if any(option.startswith(rest) for option in options) else NO


def match(text: str, at: int, names: tuple[str, ...], final: bool = False) -> Match:
    """Whether `text[at:]` (`at` a line's start) is a call written in the text. `final`: no more text
    will come (a call whose fence never closed still counts; one whose JSON never closed does not)."""
    t = _Text(text, at)
    t.skip(" \t")
    fenced = t.literal("```", "{")
    if fenced == "```":
        t.i = _LANG.match(text, t.i).end()
        t.skip(" \t")
        if (step := t.literal("\n")) != "\n":
            return Match(step)
        t.skip(" \t")
        if (step := t.literal("{")) != "{":
            return Match(step)
    elif fenced != "{":
        return Match(fenced)
    for expected in ('"name"', ":", '"'):
        t.skip(_WS)
        if (step := t.literal(expected)) != expected:
            return Match(step)
    close = text.find('"', t.i)
    name = text[t.i:close] if close >= 0 else text[t.i:]
    if close < 0:
        return Match(PARTIAL if any(n.startswith(name) for n in names) else NO)
    if name not in names:
        return Match(NO)
    t.i = close + 1
    for expected in ((",",), _KEYS, (":",)):
        t.skip(_WS)
        if (step := t.literal(*expected)) not in expected:
            return Match(step, name=name)
    t.skip(_WS)
    if t.ended or text[t.i] != "{":  # the arguments are an object
        return Match(PARTIAL if t.ended else NO, name=name)
    status, end = scan_json(text, t.i)
    if status != CALL:
        return Match(status, name=name)
    arguments, t.i = text[t.i:end], end
    t.skip(_WS)
    if (step := t.literal("}")) != "}":
        return Match(step, name=name)
    if fenced == "```":
        t.skip(_WS)
        step = t.literal("```")
        if step == NO or step == PARTIAL and not final:
            return Match(step, name=name)
        if step == PARTIAL:  # the answer ended on the fence's close, or before it
            t.i = len(text)
    return Match(CALL, t.i, name, arguments)


def scan_json(text: str, at: int) -> tuple[str, int]:
    """Whether a JSON value starts at `at`: (CALL, its end) when complete, (PARTIAL, len) while the
    text is a prefix of one, (NO, where it broke) when it cannot be one."""
    stack: list[str] = []  # the containers open: "}" or "]", what closes each
    expect = "value"  # what may come next: value, key, colon, comma (or the container's close)
    first = False  # just opened: the container may close at once
    i, n = at, len(text)
    while i < n:
        c = text[i]
        if c in _WS:
            i += 1
            continue
        if stack and c == stack[-1] and (expect == "comma" or first):
            stack.pop()
            i, expect, first = i + 1, "comma", False
            if not stack:
                return CALL, i
            continue
        first = False
        if expect in ("comma", "colon"):
            if c != ("," if expect == "comma" else ":") or expect == "comma" and not stack:
                return NO, i
            i, expect = i + 1, "value" if expect == "colon" or stack[-1] == "]" else "key"
            continue
        if c == '"':
            end = _string_end(text, i)
            if end < 0:
                return (PARTIAL, n) if end == -1 else (NO, i)
            i, expect = end, "colon" if expect == "key" else "comma"
        elif expect == "key":
            return NO, i
        elif c in "{[":
            stack.append("}" if c == "{" else "]")
            i, expect, first = i + 1, "key" if c == "{" else "value", True
            continue
        else:
            m = _SCALAR.match(text, i)
            if not m:
                return NO, i
            if m.end() == n:  # a number or a literal may go on
                return (PARTIAL, n) if _scalar_prefix(m.group(0)) else (NO, i)
            if not _SCALAR_WHOLE.fullmatch(m.group(0)):
                return NO, i
            i, expect = m.end(), "comma"
        if not stack:
            return CALL, i
    return PARTIAL, n


_SCALAR = re.compile(r"[-+.eE0-9a-z]+")
_SCALAR_WHOLE = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?|true|false|null")
_SCALAR_PREFIX = re.compile(r"-?(0|[1-9][0-9]*)?(\.[0-9]*)?([eE][-+]?[0-9]*)?")


def _scalar_prefix(text: str) -> bool:
    return bool(_SCALAR_PREFIX.fullmatch(text)) or any(w.startswith(text) for w in ("true", "false", "null"))


def _string_end(text: str, at: int) -> int:
    """The index after the JSON string opening at `at`; -1 if the text ends inside it, -2 if it is
    not one (a raw newline or control character)."""
    i = at + 1
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == '"':
            return i + 1
        if c < " ":
            return -2
        i += 1
    return -1
