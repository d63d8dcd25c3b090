"""The answer's text read once, below the adapters: reasoning parted, then tool calls read back.

`AnswerReader` takes the text as the engine commits it and gives back the answer's events
(events.py): the reasoning block's pieces (reasoning.py), the answer's text, and the request's
tool calls read from it (constraints/toolcalls.py). The same reader serves a stream and a whole
answer, so the two agree. Each step's token ids and trace ride on the last Text or ReasoningText
event that step's text gave (or a later one, where its text waited).
"""
from __future__ import annotations

from typing import Sequence

from ...logprobs import TokenLogprob
from .constraints.genericcalls import GenericReader
from .constraints.toolcalls import CallReader, finish
from .constraints.tools import ToolRequest
from .events import Event, ReasoningText, Text
from .reasoning import Parting, ReasoningReader


class AnswerReader:
    def __init__(self, parting: Parting | None, tools: ToolRequest | None):
        self.thinking = ReasoningReader(parting) if parting is not None else None
        self.calls = _call_reader(tools) if tools is not None else None
        self.text = ""  # the answer outside the reasoning block (calls and all)
        self._tokens: list[int] = []
        self._trace: list[dict] | None = None
        self._logprobs: list[TokenLogprob] | None = None

    @property
    def reasoning(self) -> str:
        return self.thinking.reasoning if self.thinking is not None else ""

    @property
    def ended(self) -> bool:
        """A repeated tool call ended the calls: generation can stop."""
        return self.calls is not None and self.calls.ended

    def feed(self, text: str, tokens: Sequence[int] = (), trace: list[dict] | None = None,
             logprobs: list[TokenLogprob] | None = None) -> list[Event]:
        self._tokens.extend(tokens)
        if logprobs is not None:
            self._logprobs = (self._logprobs or []) + logprobs
        if trace is not None:
            self._trace = (self._trace or []) + trace
        pieces = self.thinking.feed(text) if self.thinking is not None else [(False, text)]
        return self._events(pieces)

    def close(self) -> list[Event]:
        out = self._events(self.thinking.close()) if self.thinking is not None else []
        if self.calls is not None:
            out += self._attach(self.calls.close())
        return out

    def _events(self, pieces: list[tuple[bool, str]]) -> list[Event]:
        out: list[Event] = []
        for reasoning, text in pieces:
            if reasoning:
                out.append(ReasoningText(text))
                continue
            self.text += text
            out += self.calls.feed(text) if self.calls is not None else [Text(text)]
        return self._attach(out)

    def _attach(self, out: list[Event]) -> list[Event]:
        """The steps' tokens, trace and logprobs so far, on the last text event."""
        last = next((e for e in reversed(out) if type(e) in (Text, ReasoningText)), None)
        if last is not None and (self._tokens or self._trace is not None):
            last.tokens, last.trace, last.logprobs = self._tokens, self._trace, self._logprobs
            self._tokens, self._trace, self._logprobs = [], None, None
        return out

    @property
    def content(self) -> str:
        return self.calls.content if self.calls is not None else self.text

    def message(self) -> dict:
        """The assistant message in the chat form templates take: content, reasoning_content where the
        answer reasoned, tool_calls where calls were read back."""
        msg = self.calls.message() if self.calls is not None else {"role": "assistant", "content": self.text}
        if self.reasoning:
            msg["reasoning_content"] = self.reasoning
        return msg

    def finish(self, reason: str) -> str:
        return finish(self.calls, reason) if self.calls is not None else reason

    def cut(self) -> str | None:
        return self.calls.cut() if self.calls is not None else None

    @property
    def cut_call(self):
        """The tool call cut short (constraints.toolcalls.Call: its name, its arguments so far), else None."""
        return self.calls.cut_call if self.calls is not None else None


def _call_reader(tools: ToolRequest) -> CallReader:
    """The reader of the request's call form: the generic JSON object, or the template's own."""
    return (GenericReader if tools.form.kind == "generic" else CallReader).for_tools(tools)
