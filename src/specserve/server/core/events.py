"""The answer side of a generation, the same for every API: a stream of typed events an adapter shapes.

`answer.events(job)` yields, in order: `ReasoningText` pieces where the answer starts with a reasoning
block (`<think>...</think>`, parted once for every API: core/reasoning.py), `Text` pieces (with the
token ids and, where asked, the trace of who produced each token), `CallStart` and `CallArguments`
where the request's tools are read back from the text, and one `Finish`. Each piece is final when
yielded: text that might still turn out to be a marker or a tool call is held back until it is known,
and a call comes whole, once complete (a call cut by max_tokens never comes as calls do: `Finish.cut`
names it, for the APIs that show a cut call).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

from ...logprobs import TokenLogprob
from ...stats import GenerationStats


@dataclass(slots=True)
class Text:
    """Answer text. `tokens`: the ids committed with it (none where tool calls are read back: their
    text is cut at tags, not tokens); `trace`: its runs by producer (speculative.trace), else None;
    `logprobs`: one per token of `tokens` where the request asks (SamplingParams.logprobs), else None."""

    text: str
    tokens: Sequence[int] = ()
    trace: list[dict] | None = None
    logprobs: list[TokenLogprob] | None = None


@dataclass(slots=True)
class ReasoningText:
    """A piece of the answer's reasoning block, without its markers: OpenAI chat's `reasoning_content`,
    Anthropic's `thinking` block, a Responses reasoning item. `tokens`, `trace` and `logprobs` as Text's:
    those of the steps whose text this piece completed, where it is the last piece they gave."""

    text: str
    tokens: Sequence[int] = ()
    trace: list[dict] | None = None
    logprobs: list[TokenLogprob] | None = None


@dataclass(slots=True)
class CallStart:
    """A tool call, complete: its index in the answer, id and function name; its arguments follow."""

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
    context), "tool_calls" (the answer ended on complete tool calls: on its own, or on a call that
    repeated one); detail: the `finish_detail` field where the reason alone would not say why (else
    {}); stats: the counts; cut: the tool call cut short where its name was whole (a Call: name and
    arguments so far), which Anthropic's and the Responses API show as an incomplete block, else None."""

    reason: str
    detail: dict
    stats: GenerationStats
    cut: object = None


Event = Union[ReasoningText, Text, CallStart, CallArguments, Finish]
