"""llama-server's request bodies as pydantic models: /completion's (LlamaRequest), /infill's (its own fields
beside /completion's), and those of /tokenize, /detokenize and /apply-template."""
from __future__ import annotations

from typing import Any

from pydantic import Field, PrivateAttr, field_validator, model_validator

from ...http.errors import bad_request
from ..shared.generation_fields import GenerationFields
from ..shared.logprob_shapes import count
from ..shared.validation import Fields


class LlamaRequest(GenerationFields):
    prompt: Any = None  # one prompt or several: request.llama_prompts
    n_predict: int | None = None
    max_tokens: int | None = None
    return_tokens: bool | None = None
    timings_per_token: bool | None = None
    return_progress: bool | None = None  # the stream opens with `prompt_progress` events (progress.py)
    n_cmpl: int | None = None
    n: int | None = None  # n_cmpl's other name (OpenAI's)
    response_fields: list[str] | None = None  # only these fields of the answer (infill_rules.select_fields)
    n_probs: int | None = None  # each answer token's logprob and this many alternatives (shared/logprob_shapes.py)
    logprobs: int | None = None  # n_probs's OpenAI name, read where n_probs is absent (as llama-server does)
    post_sampling_probs: bool | None = None  # probabilities of the distribution sampled from, not the model's
    # llama-server's flat spelling of speculation (llama-server's n_max is our draft_max)
    n_max: int | None = Field(None, alias="speculative.n_max")
    n_min: int | None = Field(None, alias="speculative.n_min")
    p_min: float | None = Field(None, alias="speculative.p_min")

    def spec_asked(self) -> dict:
        """The speculative fields asked for, in either spelling (not both)."""
        flat = {field: v for field, v in (("draft_max", self.n_max), ("draft_min", self.n_min),
                                          ("draft_p_min", self.p_min)) if v is not None}
        if flat and self.speculative is not None:
            raise bad_request("give either the speculative object or speculative.n_max/n_min/p_min, not both",
                              "speculative")
        return flat if self.speculative is None else self.speculative.asked()

    _prompts: list = PrivateAttr(default_factory=list)  # set by llama_prompt

    def logprobs_asked(self) -> tuple[int, str] | None:
        """(alternatives, logprobs_mode) where n_probs (or logprobs) asks for some; 0 asks for none."""
        key, n = ("n_probs", self.n_probs) if self.n_probs is not None else ("logprobs", self.logprobs)
        if n is None or count(n, key) == 0:
            return None
        return n, "processed" if self.post_sampling_probs else "raw"

    @property
    def prompts(self) -> list[str | list[int]]:
        """The body's prompts (llama_prompts), read by its prompt hook: each is a completion of its own."""
        return self._prompts


_EXTRA_SHAPE = 'input_extra must be an array of {"filename": string, "text": string} objects (text required)'


class InfillRequest(LlamaRequest):
    """/infill's own fields beside /completion's."""

    input_prefix: str | None = None
    input_suffix: str | None = None
    input_extra: list[tuple[str, str]] = []  # (filename, text)
    prompt: str | None = None  # the cursor's line up to the cursor
    n_indent: int | None = None
    t_max_predict_ms: int | None = None
    t_max_prompt_ms: int | None = None  # accepted; not applied, as in llama-server
    response_fields: list[str] | None = None

    @model_validator(mode="before")
    @classmethod
    def _infill_sampler(cls, body):
        """llama.cpp's `infill` sampler (and a chain without temperature at temperature 0) means greedy
        decoding here."""
        if not isinstance(body, dict) or not isinstance(body.get("samplers"), list):
            return body
        names = [s.lower() if isinstance(s, str) else s for s in body["samplers"]]
        temperature = body.get("temperature")
        greedy_temp = isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and temperature <= 0
        if "infill" in names or ("temperature" not in names and greedy_temp):
            body = {k: v for k, v in body.items() if k != "samplers"}
            body["temperature"] = 0.0
        return body

    @field_validator("input_extra", mode="before")
    @classmethod
    def _extra(cls, value) -> list[tuple[str, str]]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise bad_request(_EXTRA_SHAPE, "input_extra")
        out = []
        for i, chunk in enumerate(value):
            if not isinstance(chunk, dict):
                raise bad_request(_EXTRA_SHAPE, f"input_extra[{i}]")
            filename, text = chunk.get("filename", "tmp"), chunk.get("text")  # text required, as llama-server
            if not isinstance(filename, str) or not isinstance(text, str):
                raise bad_request(_EXTRA_SHAPE, f"input_extra[{i}]")
            out.append((filename, text))
        return out

    @field_validator("n_indent", "t_max_predict_ms", "t_max_prompt_ms")
    @classmethod
    def _nonneg(cls, value, info):
        if value is not None and value < 0:
            raise bad_request(f"{info.field_name} must be >= 0, got {value}", info.field_name)
        return value

    @field_validator("response_fields", mode="before")
    @classmethod
    def _fields(cls, value):
        if value is not None and not (isinstance(value, list) and all(isinstance(f, str) for f in value)):
            raise bad_request("response_fields must be an array of strings", "response_fields")
        return value


class TokenizeRequest(Fields):
    content: str | list | None = None
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(Fields):
    tokens: list[int] = []


class TemplateRequest(Fields):
    messages: list | None = None
    tools: list | None = None
    tool_choice: object = None  # accepted: the prompt does not depend on it
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    chat_template_kwargs: dict | None = None
