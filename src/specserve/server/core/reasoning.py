"""Reasoning models: which markers part the reasoning from the answer, and the parting itself.

A reasoning model (Qwen3, DeepSeek-R1, QwQ) answers `<think>...</think>` first; some templates spell
their own markers. The server parts that block from the answer once, here, below the adapters: the
answer's events (events.py) carry it as `ReasoningBlock` pieces before the answer's `Text`, and each API
shapes it (OpenAI chat: `reasoning_content`; Anthropic: `thinking` blocks; Responses: reasoning items).

`--reasoning-format` (and a request's `reasoning_format`), as llama-server's:
  none      the text comes back raw, reasoning and all
  deepseek  the `<think>` block is parted from the answer
  auto      (the default) as deepseek, with the markers the model's chat template spells
            (`<think>`, `<|START_THINKING|>`, `[THINK]`, `<seed:think>`), `<think>` where it spells none
A block is recognised only at the answer's start (after blanks), or from its first token where the
prompt ends inside it (a template that opens the block itself: Qwen3-Thinking, DeepSeek-R1). The
reasoning budget (GenRequest.reasoning_budget; grammar/reasoning.py) closes the block when spent.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...config import ReasoningBlock
from .request import GenRequest

FORMATS = ("none", "deepseek", "auto")
THINK = ("<think>", "</think>")
# the markers templates spell, most common first
TAGS = (THINK, ("<|START_THINKING|>", "<|END_THINKING|>"), ("[THINK]", "[/THINK]"), ("<seed:think>", "</seed:think>"))
_BLANKS = " \t\r\n"
_TEMPLATE_KEY = "tokenizer.chat_template"


def template_tags(model) -> tuple[str, str] | None:
    """The reasoning markers the model's chat template spells (both of a pair), or None: a model that
    does not reason."""
    template = model.metadata.get(_TEMPLATE_KEY) or ""
    return next((pair for pair in TAGS if pair[0] in template and pair[1] in template), None)


@dataclass(frozen=True)
class Parting:
    """How the answer's text is parted: the markers, and whether it starts inside the block."""

    open: str
    close: str
    inside: bool


def opened(model, tokens: list[int], tag: str) -> bool:
    """Whether the prompt ends inside a block it opened (`tag` after the last token's blanks)."""
    tail = model.detokenize(tokens[-8:], special=True).decode("utf-8", "replace")
    return tail.rstrip(_BLANKS).endswith(tag)


def resolve(req: GenRequest, model, tokens: list[int], default_format: str = "auto", default_budget: int = -1
            ) -> tuple[GenRequest, Parting | None]:
    """The request with its engine-side reasoning rule (SamplingParams.reasoning), and how its answer is
    parted (None: not at all). A chat takes the server's defaults; a prompt (/completion, /v1/completions)
    is raw unless the request asks. The rule is set for a model whose template reasons, a prompt that
    ends inside a block, or a budget: for_request (grammar/) then keeps the budget and starts any output
    constraint (the tools' grammar, a schema) after the block, where one is needed."""
    chat = req.messages is not None
    fmt = req.reasoning_format or (default_format if chat else "none")
    budget = req.reasoning_budget if req.reasoning_budget is not None else default_budget if chat else -1
    if not chat and fmt == "none" and budget < 0:
        return req, None
    own = template_tags(model)
    tags = THINK if fmt == "deepseek" else (own or THINK)
    inside = opened(model, tokens, tags[0])
    sampling = req.sampling
    if own is not None and chat or inside or budget >= 0:
        sampling = dataclasses.replace(sampling, reasoning=ReasoningBlock(*tags, inside=inside, budget=budget))
    parting = Parting(*tags, inside) if fmt != "none" else None
    return (dataclasses.replace(req, sampling=sampling) if sampling is not req.sampling else req), parting


def _held(text: str, marker: str) -> int:
    """How many characters at the end of `text` could begin `marker` (and so must wait)."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


class ReasoningReader:
    """Feed the answer's text as it comes; get back (is_reasoning, text) pieces, each final. The
    reasoning loses its blanks at both ends and the answer those right after the close tag, as
    llama-server's parser does; text that may still be a marker (or blanks before one) waits."""

    def __init__(self, parting: Parting):
        self._open, self._close = parting.open, parting.close
        self._state = "think" if parting.inside else "start"
        self._buf = ""
        self._started = False  # some reasoning was given out (its leading blanks are gone)
        self.reasoning = ""

    def feed(self, text: str) -> list[tuple[bool, str]]:
        self._buf += text
        out: list[tuple[bool, str]] = []
        while self._step(out):
            pass
        return out

    def _step(self, out: list) -> bool:
        buf = self._buf
        if self._state == "start":
            head = buf.lstrip(_BLANKS)
            if head.startswith(self._open):
                self._buf, self._state = head[len(self._open):], "think"
                return True
            if self._open.startswith(head):
                return False  # blanks, or the open tag's start: wait
            self._state = "answer"
            return True
        if self._state == "think":
            at = buf.find(self._close)
            end = at if at >= 0 else len(buf) - _held(buf, self._close)
            keep = len(buf[:end].rstrip(_BLANKS))  # blanks wait: they may end the reasoning
            self._reasoning(buf[:keep], out)
            if at < 0:
                self._buf = buf[keep:]
                return False
            self._buf, self._state = buf[at + len(self._close):], "after"
            return True
        if self._state == "after":  # the blanks after the close tag are not the answer's
            self._buf = buf.lstrip(_BLANKS)
            if not self._buf:
                return False
            self._state = "answer"
            return True
        if buf:
            out.append((False, buf))
            self._buf = ""
        return False

    def _reasoning(self, text: str, out: list) -> None:
        if not self._started:
            text = text.lstrip(_BLANKS)
        if text:
            self._started = True
            self.reasoning += text
            out.append((True, text))

    def close(self) -> list[tuple[bool, str]]:
        """At the end of generation: what still waited (a block never closed is all reasoning)."""
        out: list[tuple[bool, str]] = []
        if self._state == "think":
            self._reasoning(self._buf.rstrip(_BLANKS), out)
        elif self._state in ("start", "answer") and self._buf:
            out.append((False, self._buf))
        self._buf = ""
        return out
