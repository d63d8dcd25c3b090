"""OpenAI tools -> the chat template's call form, as one llguidance Lark grammar.

A request's `tools` (functions whose `parameters` are JSON Schemas), `tool_choice` and
`parallel_tool_calls` become a grammar in the form the model was trained to call in, which
its chat template spells out. The one form known here is Hermes's, which Qwen2.5 (and Qwen3,
Hermes) use:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

with calls separated by a newline. The arguments are embedded with llguidance's `%json`, so
they follow that tool's schema; the wrapper and the name are forced (and so drafted for free).
`tool_choice`: "none" -> text without a call; "auto" -> text, or text then calls; "required"
-> one or more calls; a named function -> exactly one call of it. `parallel_tool_calls: false`
-> at most one call.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from ..grammar import CompiledGrammar, GrammarError, compile_grammar, from_json_schema, from_lark
from ..grammar.limits import MAX_TOOLS, check_schema, limit_error
from ..grammar.sources import JSON_LAYOUT
from .compiling import compile_off_loop
from .errors import ApiError, bad_request
from .structured import StrictModel, conflict, constraint, grammar_error, parse, requested, source_of

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI's rule for function names
_TEMPLATE_KEY = "tokenizer.chat_template"
_ATTR_CONTROL, _ATTR_USER_DEFINED = 1 << 3, 1 << 4


class Function(StrictModel):
    name: str = Field(pattern=_NAME.pattern)
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


@dataclass(frozen=True)
class CallForm:
    """How a model's template spells a call: the tags around `{"name": ..., "arguments": ...}`;
    `special`: the tags are single control-like tokens (a text lexeme cannot spell them)."""

    open: str = "<tool_call>"
    close: str = "</tool_call>"
    special: bool = True

    @property
    def prefix(self) -> str:
        """What comes between the open tag and the name's text."""
        return '\n{"name": "'

    @property
    def middle(self) -> str:
        return '", "arguments": '

    @property
    def suffix(self) -> str:
        """What follows the arguments, up to and including the close tag."""
        return "}\n" + self.close


@dataclass(frozen=True)
class ToolRequest:
    """A request's tools, validated: what the template gets and how the answer is read."""

    tools: list[dict]  # as sent, for the chat template (as Hugging Face passes them)
    names: tuple[str, ...]
    choice: str  # "none", "auto", "required", or the one function's name
    parallel: bool
    form: CallForm
    grammar: str


def call_form(model) -> CallForm | None:
    """The call form the model's chat template spells, or None if it has no tool support."""
    template = model.metadata.get(_TEMPLATE_KEY) or ""
    if "tools" not in template or "<tool_call>" not in template:
        return None
    return CallForm(special=all(_single_special(model, tag) for tag in ("<tool_call>", "</tool_call>")))


def _single_special(model, text: str) -> bool:
    """Whether `text` is one token that llguidance treats as special (a control token, or a
    user-defined one spelled like a tag, as llguidance's llama.cpp tokenizer marks them)."""
    ids = model.tokenize(text, add_special=False, parse_special=True)
    if len(ids) != 1:
        return False
    attr = model.vocab.token_attrs[ids[0]]
    return bool(attr & _ATTR_CONTROL or attr & _ATTR_USER_DEFINED and text.startswith("<") and text.endswith(">"))


def no_tool_support(param: str = "tools") -> ApiError:
    return bad_request(f"{param}: this model's chat template has no tool support (it does not spell a tool call), "
                       "so tools, tool messages and tool_calls cannot be rendered for it", param,
                       "unsupported_parameter")


def _tool_message(messages: list) -> str | None:
    """The field of the first tool message or assistant tool call, for the 400 that names it."""
    for i, m in enumerate(messages):
        if isinstance(m, dict) and m.get("role") == "tool":
            return f"messages[{i}].role"
        if isinstance(m, dict) and m.get("tool_calls"):
            return f"messages[{i}].tool_calls"
    return None


def tool_request(body: dict, model) -> ToolRequest | None:
    """The body's tools as a ToolRequest (None without tools). Raises ApiError(400) naming the field."""
    raw = body.get("tools")
    choice_raw = body.get("tool_choice")
    if raw is None or raw == []:
        if choice_raw not in (None, "none", "auto"):
            raise bad_request("tool_choice needs tools", "tool_choice")
        return None
    if not isinstance(raw, list):
        raise bad_request("tools must be an array of tools", "tools")
    if len(raw) > MAX_TOOLS:
        raise grammar_error(limit_error("tools", f"holds {len(raw):,}", MAX_TOOLS, "tools in a request"), "tools")
    tools = [parse(Tool, t, f"tools[{i}]") for i, t in enumerate(raw)]
    names = tuple(t.function.name for t in tools)
    for i, name in enumerate(names):
        if name in names[:i]:
            raise bad_request(f"tools[{i}].function.name: {name!r} is given twice", f"tools[{i}].function.name")
    choice = _choice(choice_raw, names)
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise bad_request("parallel_tool_calls must be a boolean", "parallel_tool_calls")
    form = call_form(model)
    if form is None:
        raise no_tool_support()
    schemas = [_arguments_schema(t.function.parameters, i) for i, t in enumerate(tools)]
    try:
        check_schema({"anyOf": schemas}, "the tools' parameters together")  # each was checked on its own
    except GrammarError as e:
        raise grammar_error(e, "tools") from None
    lark = tools_lark(form, names, schemas, choice, parallel)
    grammar = from_lark(lark, validate=False, limit=False)  # compiled once, for the target (request_constraint)
    return ToolRequest(list(raw), names, choice, parallel, form, grammar)


def _choice(value, names: tuple[str, ...]) -> str:
    if value is None:
        return "auto"
    if isinstance(value, str):
        if value not in ("none", "auto", "required"):
            raise bad_request(f"Invalid value for 'tool_choice': {value!r}. Supported values are: 'none', 'auto', "
                              "'required', or an object naming a function.", "tool_choice", "invalid_value")
        return value
    named = parse(NamedChoice, value, "tool_choice")
    if named.function.name not in names:
        raise bad_request(f"tool_choice names the function {named.function.name!r}, which is not among the tools "
                          f"({', '.join(names)})", "tool_choice.function.name", "invalid_value")
    return named.function.name


def _arguments_schema(parameters: dict | None, i: int) -> dict:
    """The tool's parameters schema, checked on its own (so the 400 names the tool), in the
    template's JSON layout."""
    param = f"tools[{i}].function.parameters"
    schema = {"type": "object", "properties": {}} if parameters is None else dict(parameters)
    if schema.get("type", "object") != "object":
        raise bad_request(f"{param}: a function's parameters must be a JSON Schema of type 'object', got "
                          f"{json.dumps(schema.get('type'))[:40]}", param, "invalid_value")
    try:
        from_json_schema(schema, validate=False)  # the limits; llguidance's own check comes with the compile
    except GrammarError as e:
        raise bad_request(f"{param}: {e}", param, "invalid_grammar") from None
    # %json takes no defaults: the layout goes into the schema. The template renders arguments with
    # `tojson` (json.dumps's layout), which is what the model was trained on.
    layout = schema.get("x-guidance")
    schema["x-guidance"] = {**JSON_LAYOUT, **layout} if isinstance(layout, dict) else JSON_LAYOUT
    return schema


def _lit(text: str) -> str:
    """A Lark string literal for text (JSON's escapes are Lark's)."""
    return json.dumps(text, ensure_ascii=False)


def tools_lark(form: CallForm, names: tuple[str, ...], schemas: list[dict], choice: str, parallel: bool) -> str:
    """The Lark grammar for these tools in this call form, under this choice."""
    tag = (lambda t: t) if form.special else _lit  # a special token is named bare: <tool_call>
    lines = []
    for i, (name, schema) in enumerate(zip(names, schemas)):
        lines.append(f"call_{i}: {tag(form.open)} {_lit(form.prefix + name + form.middle)} args_{i} "
                     f"{_lit(form.suffix[:-len(form.close)])} {tag(form.close)}")
        lines.append(f"args_{i}: %json {json.dumps(schema, ensure_ascii=False)}")
    lines.append("call: " + " | ".join(f"call_{i}" for i in range(len(names))))
    lines.append('calls: call ("\\n" call)*' if parallel else "calls: call")
    if form.special:  # text is bytes, a special token is not; nor may TEXT spell the open tag in plain
        # tokens, which the reader (toolcalls.py), reading text, would take for a call
        lines.append(f"TEXT: /(.|\\n)+/ & ~/(.|\\n)*{re.escape(form.open)}(.|\\n)*/")
    else:  # the tags are plain text: a TEXT may not start with the open tag
        lines.append(f"TEXT: /(.|\\n)+/ & ~/{re.escape(form.open)}(.|\\n)*/")
    if choice == "none":
        start = "TEXT?"
    elif choice == "auto":
        start = "TEXT | TEXT? calls" if form.special else "TEXT | calls"
    elif choice == "required":
        start = "calls"
    else:
        start = f"call_{names.index(choice)}"
    return "\n".join([f"start: {start}", *lines]) + "\n"


async def request_constraint(body: dict, state, chat: bool) -> tuple[CompiledGrammar | None, ToolRequest | None]:
    """The grammar a request's constraint fields and tools ask for, compiled for the target's
    vocabulary, and its tools (chat only). Raises ApiError(400) naming the field. A request with a
    constraint or tools is read and compiled on a grammar worker (compiling.py), off the event loop."""
    keys = requested(body)
    if not keys and not (chat and body.get("tools")):
        return _constraint(body, state.engine, chat)
    return await compile_off_loop(state.grammars, source_of(body)[0], _constraint, body, state.engine, chat)


def _constraint(body: dict, engine, chat: bool) -> tuple[CompiledGrammar | None, ToolRequest | None]:
    keys = requested(body)
    if not chat and (body.get("tools") or body.get("tool_choice") not in (None, "none", "auto")):
        raise bad_request("tools are for /v1/chat/completions", "tools", "unsupported_parameter")
    tools = tool_request(body, engine.target) if chat else None
    used = _tool_message(body.get("messages") or []) if chat else None
    if used is not None and tools is None and call_form(engine.target) is None:
        raise no_tool_support(used)
    calls = tools is not None and tools.choice != "none"
    if calls and keys:
        raise conflict("tools", keys[0])
    grammar = constraint(body)
    if grammar is None and tools is not None:
        grammar = tools.grammar
    if grammar is None:
        return None, tools
    param, what = source_of(body)
    try:
        return compile_grammar(grammar, engine.grammar_tokenizer(), what, param), tools
    except GrammarError as e:
        if param == "tools":
            _name_the_tool(body)
        raise grammar_error(e, param) from None


def _name_the_tool(body: dict) -> None:
    """400 naming the tool whose parameters llguidance refuses (only once the tools' grammar failed)."""
    for i, tool in enumerate(body["tools"]):
        param = f"tools[{i}].function.parameters"
        try:
            from_json_schema(_arguments_schema(tool["function"].get("parameters"), i))
        except GrammarError as e:
            raise bad_request(f"{param}: {e}", param, "invalid_grammar") from None
