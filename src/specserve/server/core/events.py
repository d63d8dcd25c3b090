"""The answer side of a generation, the same for every API: a stream of typed events an adapter shapes.

`answer.events(job)` yields, in order: `Text` pieces (with the token ids and, where asked, the
trace of who produced each token), `CallStart` and `CallArguments` where the request's tools are
read back from the text, and one `Finish`. Each piece is final when yielded: text that might still
turn out to be a tool call's tag is held back until it is known. A parser of reasoning blocks goes
between the engine's chunks and these events, for every API at once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

from ...stats import GenerationStats


@dataclass(slots=True)
class Text:
    """Answer text. `tokens`: the ids committed with it (none where tool calls are read back: their
    text is cut at tags, not tokens); `trace`: its runs by producer (speculative.trace), else None."""

    text: str
    tokens: Sequence[int] = ()
    trace: list[dict] | None = None


@dataclass(slots=True)
class CallStart:
    """A tool call begins: its index in the answer, id and function name (all final)."""

    index: int
    id: str
    name: str


@dataclass(slots=True)
class CallArguments:
    """A fragment of tool call `index`'s arguments (JSON text; the fragments join to the whole)."""

    index: int
    text: str


@dataclass(slots=True)
class Finish:
    """The end. reason: "stop" (end of generation or a stop string), "length" (max_tokens or the
    context), "tool_calls" (the answer ended on its own after complete tool calls); detail: the
    `finish_detail` field where the reason alone would not say why (else {}); stats: the counts."""

    reason: str
    detail: dict
    stats: GenerationStats


Event = Union[Text, CallStart, CallArguments, Finish]
