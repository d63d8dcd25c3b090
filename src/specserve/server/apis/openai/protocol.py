"""OpenAI's request bodies as pydantic models: chat completions, completions, Responses, and their tools.

`OpenAIGeneration` adds OpenAI's `stream_options` and `n` and llama-server's `verbose`, `timings_per_token`
and `return_progress` to the shared fields (shared/fields.Generation). `ResponsesRequest` checks a
/v1/responses body: `input` (a string, or items: messages, `function_call`, `function_call_output`,
`reasoning`), `instructions`, `tools` (function tools; the hosted ones are left out, as llama-server
does), `tool_choice`, `parallel_tool_calls`, `max_output_tokens`, `text.format`, `reasoning.effort`. The
tools' shapes are checked as OpenAI checks them (StrictModel: unknown fields refused, OpenAI's codes).
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from ...core.constraints.structured import json_object, schema_grammar
from ...core.constraints.tools import NAME
from ...core.reasoning import FORMATS
from ...http.errors import bad_request
from ..shared.generation_fields import GenerationFields
from ..shared.logprob_shapes import count
from ..shared.validation import Fields, StrictModel


class StreamOptions(Fields):
    include_usage: bool | None = None


class OpenAIGeneration(GenerationFields):
    """The shared fields, OpenAI's `stream_options` and `n`, and llama-server's `verbose` and
    `timings_per_token`."""

    stream_options: StreamOptions | None = None
    n: int | None = None
    verbose: bool | None = None  # the answer carries `__verbose` (also with the server's --verbose)
    timings_per_token: bool | None = None  # each streamed chunk carries `timings`
    return_progress: bool | None = None  # a stream opens with `prompt_progress` events (progress.py)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and bool(self.stream_options.include_usage)


class Function(StrictModel):
    name: str = Field(pattern=NAME.pattern)
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class Tool(StrictModel):
    type: Literal["function"]
    function: Function


class NamedFunction(StrictModel):
    name: str


class NamedChoice(StrictModel):
    type: Literal["function"]
    function: NamedFunction


class ChatRequest(OpenAIGeneration):
    messages: list | None = None
    max_completion_tokens: int | None = None
    max_tokens: int | None = None
    n_predict: int | None = None  # llama-server's name (-1: no limit; 0: only put the prompt in a slot's cache)
    tools: list[Tool] | None = None
    tool_choice: Any = None  # "none", "auto", "required" or {"type": "function", ...}: tools.py
    parallel_tool_calls: bool | None = None
    add_generation_prompt: bool | None = None  # llama-server's and vLLM's
    continue_final_message: bool | None = None  # the last (assistant) message is continued (core/assistant_prefill.py)
    chat_template_kwargs: dict | None = None  # more variables for the chat template (llama-server's, vLLM's)
    reasoning_format: str | None = None  # llama-server's: "none", "deepseek", "auto" (core/reasoning.py)
    reasoning_budget: int | None = None  # llama-server's: -1 unlimited, 0 no reasoning, n tokens
    thinking_budget_tokens: int | None = None  # Continue's name for it
    logprobs: bool | None = None  # each answer token's logprob (shared/logprob_shapes.py: both shapes)
    top_logprobs: int | None = None  # and this many alternatives at each
    post_sampling_probs: bool | None = None  # llama-server's: probabilities of the distribution sampled from

    def logprobs_asked(self) -> tuple[int, str] | None:
        """(alternatives, logprobs_mode) where logprobs are asked for; 400 for top_logprobs without them."""
        if not self.logprobs:
            if self.top_logprobs is not None:
                raise bad_request("top_logprobs requires logprobs to be true", "top_logprobs")
            return None
        return count(self.top_logprobs or 0, "top_logprobs"), "processed" if self.post_sampling_probs else "raw"

    def reasoning_asked(self) -> tuple[str | None, int | None]:
        """(reasoning_format, budget) asked for, or 400 naming the field."""
        if self.reasoning_format is not None and self.reasoning_format not in FORMATS:
            raise bad_request(f"reasoning_format must be one of {', '.join(FORMATS)}, got "
                              f"{self.reasoning_format[:40]!r}", "reasoning_format", "invalid_value")
        budgets = [(k, v) for k, v in (("reasoning_budget", self.reasoning_budget),
                                       ("thinking_budget_tokens", self.thinking_budget_tokens)) if v is not None]
        for key, v in budgets:
            if v < -1:
                raise bad_request(f"{key} must be -1 (unlimited), 0 (no reasoning) or a number of tokens, got {v}",
                                  key, "invalid_value")
        if len(budgets) == 2 and budgets[0][1] != budgets[1][1]:
            raise bad_request("reasoning_budget and thinking_budget_tokens differ: give one of them",
                              "thinking_budget_tokens", "conflicting_parameters")
        return self.reasoning_format, budgets[0][1] if budgets else None


class CompletionRequest(OpenAIGeneration):
    prompt: Any = None  # a string or token ids: fields.prompt_value
    suffix: str | None = None
    max_tokens: int | None = None
    echo: bool | None = None  # the prompt's text before each choice's
    logprobs: int | None = None  # each answer token's logprob and this many alternatives (OpenAI's legacy shape)

    def logprobs_asked(self) -> tuple[int, str] | None:
        if self.logprobs is None:
            return None
        if self.echo:  # the prompt's logprobs, which echo gives with them, are not computed
            raise bad_request("logprobs with echo is not supported: the prompt's logprobs are not computed",
                              "logprobs", "unsupported_parameter")
        return count(self.logprobs, "logprobs"), "raw"


class FunctionTool(StrictModel):
    type: Literal["function"]
    name: str = Field(pattern=NAME.pattern)
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class TextFormat(Fields):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict | None = Field(None, alias="schema")  # `schema` would shadow BaseModel.schema
    strict: bool | None = None


class TextConfig(Fields):
    format: TextFormat | None = None


class ReasoningOptions(Fields):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


class FunctionCallItem(Fields):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionOutputItem(Fields):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list


class MessageItem(Fields):
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list
    type: Literal["message"] | None = None


class ResponsesRequest(GenerationFields):
    input: str | list | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    tools: list | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningOptions | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    background: bool | None = None
    metadata: dict | None = None  # echoed back, as OpenAI's API does
    timings_per_token: bool | None = None  # llama-server's: text deltas carry `timings`
    return_progress: bool | None = None  # llama-server's: response.in_progress events with `prompt_progress`

    def format_grammar(self) -> tuple[str, str] | None:
        """(param, grammar) of text.format, for constraint_fields.output_grammar (None: plain text)."""
        fmt = self.text.format if self.text is not None else None
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return "text.format", json_object(validate=False)
        if fmt.schema_ is None:
            raise bad_request("Missing required parameter: 'text.format.schema'", "text.format.schema",
                              "missing_required_parameter")
        return "text.format", schema_grammar(fmt.schema_, "text.format.schema")

    def reasoning_effort(self) -> str | None:
        return self.reasoning.effort if self.reasoning is not None else None

    def reasoning_budget(self) -> int | None:
        """The reasoning budget in tokens (GenRequest.reasoning_budget): 0 for effort "none" (the block
        closed at once), else None (the server's --reasoning-budget: an effort names no token count)."""
        return 0 if self.reasoning_effort() == "none" else None

    def reasoning_asked(self) -> tuple[str | None, int | None]:
        return None, self.reasoning_budget()
