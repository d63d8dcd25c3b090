"""The one internal generation request: what every API's adapter turns its body into.

Below the adapters nothing asks which API a request came in by: a `GenRequest` says what to run
(the prompt as text, token ids or chat messages; sampling and speculation; tools and their grammar),
where (`id_slot`, `cache_prompt`) and how the answer is produced (`stream`). `endpoint` is only a
label for metrics and the log line.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...config import SamplingParams, SpecParams
from ..http.errors import bad_request
from .constraints.tools import ToolRequest


@dataclass(frozen=True)
class GenRequest:
    """One generation request, validated. Exactly one of `prompt` and `messages` is set."""

    endpoint: str  # the metrics label: "completions", "chat", "llama", "infill", ...
    model: str  # the profile that gave the defaults (the name the client asked for)
    sampling: SamplingParams  # with its grammar (an output constraint or the tools') and healed bytes
    spec: SpecParams
    verify: str  # "gumbel" or "rejection"
    stream: bool
    prompt: str | list[int] | None = None  # text (control tokens parsed, as llama-server does) or token ids
    messages: list | None = None  # a chat, rendered by the model's template (with `tools`)
    cache_prompt: bool = True  # reuse the slot's cached prefix of the prompt (llama-server's field)
    # what set sampling.max_tokens, for the context check ("max_tokens=100"); None: nothing did, and
    # generation runs until the context fills
    limit: str | None = None
    tools: ToolRequest | None = None  # passed to the template; the answer's calls are read back (answer.py)
    id_slot: int = -1  # run on this slot, waiting for it if busy; -1: the free one whose cache fits best
    warm: bool = False  # only put the prompt into the slot's caches (target and draft), generate nothing
    # a reasoning model's block (core/reasoning.py): how it is parted from the answer ("none", "deepseek",
    # "auto"; None: the server's --reasoning-format for a chat, "none" for a prompt), and its budget in
    # tokens (-1: unlimited; 0: closed at once; None: the server's --reasoning-budget for a chat, else
    # unlimited). Every API's field maps here: llama-server's reasoning_budget, Continue's
    # thinking_budget_tokens, Anthropic's thinking.budget_tokens
    reasoning_format: str | None = None
    reasoning_budget: int | None = None

    @property
    def reads_calls(self) -> bool:
        """Whether the answer's text is read for tool calls (tools given, and tool_choice is not "none")."""
        return self.tools is not None and self.tools.choice != "none"


def check_context(req: GenRequest, n_prompt: int, n_ctx: int) -> None:
    """400 `context_length_exceeded` (OpenAI's answer) when the prompt and the tokens asked for
    cannot both fit the context. Without a limit asked for, generation runs until the context fills."""
    if req.limit is None or n_prompt + req.sampling.max_tokens <= n_ctx:
        return
    n = req.sampling.max_tokens
    field = "messages" if req.messages is not None else "prompt"
    raise bad_request(f"This model's maximum context length is {n_ctx} tokens. However, you requested {n_prompt + n} "
                      f"tokens ({n_prompt} in the {field}, {n} for the completion: {req.limit}). Please reduce the "
                      f"length of the {field} or of the completion.", field, "context_length_exceeded")
