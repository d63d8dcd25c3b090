"""Ollama's request bodies as pydantic models.

`ChatRequest` (/api/chat) and `GenerateRequest` (/api/generate) share `OllamaFields`: `model`
(required, as Ollama requires it), `stream` (true unless false: Ollama's default), `format` ("json" or a
JSON schema), `think`, `keep_alive` and `options`. The sampling options are read into the shared
fields (shared/fields.Generation) under their own names, and a wrong one is a 400 naming
`options.temperature`; options that only set how Ollama loads a model are accepted and not read; the
samplers this server lacks are refused. Every refusal is a 400 naming the field by its path.
"""
from __future__ import annotations

import json

from pydantic import model_validator

from ...core.constraints.structured import json_object, schema_grammar
from ...http.errors import bad_request
from ..shared.generation_fields import GenerationFields
from ..shared.validation import Fields, parse

TEXT_ONLY = "this server reads text: images are not supported (it serves a text model's GGUF)"


class Options(Fields):
    """Ollama's `options` that this server reads (Modelfile PARAMETERs)."""

    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int | None = None
    num_predict: int | None = None
    stop: list[str] | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    num_ctx: int | None = None


# Options that set how Ollama loads and runs a model, not what it samples: the server was started
# with its own (-c, -t, --gpu-layers), and the answer is the same either way
LOAD_OPTIONS = ("numa", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all", "vocab_only",
                "use_mmap", "use_mlock", "embedding_only", "num_thread", "rope_frequency_base", "rope_frequency_scale",
                # what to keep when Ollama shifts a full context (this server refuses a prompt past the context
                # instead), and a newline penalty Ollama itself no longer applies
                "num_keep", "penalize_newline")
# sampling options this server does not have, and the value each has when it does nothing
_NEUTRAL_OPTIONS = {"mirostat": 0, "typical_p": 1, "tfs_z": 1}
_LIFTED = ("temperature", "top_k", "top_p", "min_p", "seed", "stop", "repeat_penalty", "repeat_last_n",
           "presence_penalty", "frequency_penalty")


def _options(value) -> dict:
    """The body's `options` read into the shared fields' names (num_predict and num_ctx as they are)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad_request("options must be an object", "options")
    for key, neutral in _NEUTRAL_OPTIONS.items():
        v = value.get(key)
        if v is not None and v != neutral:
            raise bad_request(f"options.{key}={json.dumps(v)[:40]} is not supported by this server; use temperature, "
                              "top_k, top_p, min_p and the penalties", f"options.{key}", "unsupported_parameter")
    opts = parse(Options, {k: v for k, v in value.items() if k not in LOAD_OPTIONS}, "options")
    lifted = {k: getattr(opts, k) for k in _LIFTED if getattr(opts, k) is not None}
    # Ollama's -1 (until the model stops) and -2 (until the context is full) are both "no limit" here
    if opts.num_predict is not None and opts.num_predict >= 0:
        lifted["num_predict"] = opts.num_predict
    if opts.num_ctx is not None:
        lifted["num_ctx"] = opts.num_ctx
    return lifted


class OllamaFields(GenerationFields):
    """What /api/chat and /api/generate share."""

    stream: bool | None = True
    format: str | dict | None = None
    think: bool | str | None = None
    # accepted, not read: the one model stays loaded for the server's life (single-model mode has
    # nothing to unload, and nothing else to load)
    keep_alive: str | int | float | None = None
    options: dict | None = None
    num_predict: int | None = None  # from options: the limit on generated tokens
    num_ctx: int | None = None  # from options: checked against the server's context (request.check)

    @model_validator(mode="before")
    @classmethod
    def _lift_options(cls, body):
        if not isinstance(body, dict):
            return body
        for key in ("num_predict", "num_ctx", *_LIFTED):
            if key in body:  # Ollama's sampling fields are read from `options` only
                raise bad_request(f"{key} is an Ollama option: send \"options\": {{\"{key}\": ...}}", key)
        lifted = _options(body.get("options"))
        return {**body, **lifted, "stream": body.get("stream") is not False}

    @model_validator(mode="after")
    def _known(self):
        if not self.model:
            raise bad_request("model is required", "model")
        if isinstance(self.think, str) and self.think not in ("low", "medium", "high"):
            raise bad_request("think must be true, false, \"low\", \"medium\" or \"high\"", "think")
        if isinstance(self.format, str) and self.format not in ("", "json"):
            raise bad_request("format must be \"json\" or a JSON schema object", "format")
        return self

    def format_grammar(self) -> tuple[str, str] | None:
        """`format`: "json" is any JSON object, an object is the JSON schema the answer must follow."""
        if not self.format:
            return None
        if self.format == "json":
            return "format", json_object(validate=False)
        return "format", schema_grammar(self.format, "format")

    def reasoning_asked(self) -> tuple[str | None, int | None]:
        """`think`: false closes the model's reasoning block at once (budget 0); true or a level parts it
        into `thinking` (also a raw prompt's); left out, the server's defaults."""
        if self.think is None:
            return None, None
        return (None, 0) if self.think is False else ("auto", None)


class ChatRequest(OllamaFields):
    messages: list | None = None
    tools: list | None = None


class GenerateRequest(OllamaFields):
    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list | None = None
    raw: bool | None = None
    images: list | None = None


class Function(Fields):
    name: str
    description: str | None = None
    parameters: dict | None = None


class Tool(Fields):
    type: str | None = "function"
    function: Function


class CallFunction(Fields):
    name: str
    arguments: dict | str | None = None


class ToolCall(Fields):
    function: CallFunction


class Message(Fields):
    role: str
    content: str | None = None
    thinking: str | None = None
    images: list | None = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None
