"""The one internal generation request: what every API's adapter turns its body into.

Below the adapters nothing asks which API a request came in by: a `GenRequest` says what to run
(the prompt as text, token ids or chat messages; sampling and speculation; tools and their grammar),
where (`id_slot`, `cache_prompt`) and how the answer is produced (`stream`). `endpoint` is only a
label for metrics and the log line.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...config import SamplingParams, SpecParams
from ..http.errors import ApiError
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
    continue_final: bool = False  # the chat's last (assistant) message is continued, not answered
    # more variables for the chat template (chat_template_kwargs), over the server's
    template_kwargs: dict | None = None
    cache_prompt: bool = True  # reuse the slot's cached prefix of the prompt (llama-server's field)
    # what set sampling.max_tokens ("max_tokens=100"); None: nothing did, and generation runs until the
    # context fills. Either way it is cut to what the context leaves (fit_context)
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


def fit_context(req: GenRequest, n_prompt: int, n_ctx: int) -> GenRequest:
    """The request with its limit on generated tokens cut to what the context leaves after the prompt:
    generation ends there with finish_reason "length", as llama-server's does (Continue and other
    clients send max_tokens 4096 whatever the context). A prompt that leaves no room: `exceed_context`."""
    if n_prompt >= n_ctx:
        raise exceed_context(n_prompt, n_ctx, "messages" if req.messages is not None else "prompt")
    room = n_ctx - n_prompt
    if req.sampling.max_tokens <= room:
        return req
    return dataclasses.replace(req, sampling=dataclasses.replace(req.sampling, max_tokens=room))


def exceed_context(n_prompt: int, n_ctx: int, field: str) -> ApiError:
    """400 for a prompt the context cannot hold with one generated token: OpenAI's code, llama-server's
    type and numbers (`n_prompt_tokens`, `n_ctx`; llama.vscode reads them)."""
    return ApiError(400, f"request ({n_prompt} tokens) exceeds the available context size ({n_ctx} tokens): the "
                         f"{field} must leave room for at least one generated token; shorten it or start the server "
                         "with a larger -c", field, "context_length_exceeded", kind="exceed_context_size_error",
                    extra={"n_prompt_tokens": n_prompt, "n_ctx": n_ctx})
