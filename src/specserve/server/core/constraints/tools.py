"""Tools -> the chat template's call form, as one llguidance Lark grammar.

A request's tools (functions whose parameters are JSON Schemas), its tool choice and whether
calls may come in parallel become a grammar in the form the model was trained to call in, which
its chat template spells out. The one form known here is Hermes's, which Qwen2.5 (and Qwen3,
Hermes) use:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

with calls separated by a newline. The arguments are embedded with llguidance's `%json`, so
they follow that tool's schema; the wrapper and the name are forced (and so drafted for free).
The choice: "none" -> text without a call; "auto" -> text, or text then calls; "required"
-> one or more calls; a function's name -> exactly one call of it. Not parallel -> at most one call.
Each API's adapter reads its own spelling of tools into `ToolSpec`s (OpenAI's
`{"type": "function", "function": {...}}`, Anthropic's `{"name", "input_schema"}`); errors name
the field by the path the adapter gives.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ....grammar import GrammarError, from_json_schema, from_lark
from ....grammar.sources import JSON_LAYOUT
from ...http.errors import ApiError, bad_request

NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI's rule for function names (Anthropic's too)
_TEMPLATE_KEY = "tokenizer.chat_template"
_ATTR_CONTROL, _ATTR_USER_DEFINED = 1 << 3, 1 << 4


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
class ToolSpec:
    """One tool as an adapter read it: its name, the JSON Schema of its arguments (None: any object),
    and where in the request each was given (for the 400 that names it)."""

    name: str
    parameters: dict | None
    name_param: str  # "tools[0].function.name"
    parameters_param: str  # "tools[0].function.parameters"


@dataclass(frozen=True)
class ToolRequest:
    """A request's tools, validated: what the template gets and how the answer is read."""

    tools: list[dict]  # for the chat template, in the form Hugging Face passes them (OpenAI's)
    names: tuple[str, ...]
    choice: str  # "none", "auto", "required", or the one function's name
    parallel: bool
    form: CallForm
    grammar: str | None  # None: tool_choice "none" on a template whose call form is not known here


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


def tool_request(model, template_tools: list[dict], specs: list[ToolSpec], choice: str,
                 parallel: bool) -> ToolRequest:
    """The tools as a ToolRequest: the template's call form and the grammar of the calls `choice`
    allows (a name in `specs`, or "none", "auto", "required"). Raises ApiError(400) naming the field."""
    names = tuple(s.name for s in specs)
    for i, spec in enumerate(specs):
        if spec.name in names[:i]:
            raise bad_request(f"{spec.name_param}: {spec.name!r} is given twice", spec.name_param)
    form = call_form(model)
    if form is None:
        if choice == "none":  # rendered for the template; no call is asked for or read back
            return ToolRequest(list(template_tools), names, choice, parallel, CallForm(), None)
        raise no_tool_support()
    schemas = [arguments_schema(s.parameters, s.parameters_param) for s in specs]
    lark = tools_lark(form, names, schemas, choice, parallel)
    try:
        grammar = from_lark(lark)
    except GrammarError as e:
        raise bad_request(f"tools: {e}", "tools", "invalid_grammar") from None
    return ToolRequest(list(template_tools), names, choice, parallel, form, grammar)


def arguments_schema(parameters: dict | None, param: str) -> dict:
    """The tool's parameters schema, checked on its own (so the 400 names the tool: `param`), in the
    template's JSON layout."""
    schema = {"type": "object", "properties": {}} if parameters is None else dict(parameters)
    if schema.get("type", "object") != "object":
        raise bad_request(f"{param}: a function's parameters must be a JSON Schema of type 'object', got "
                          f"{json.dumps(schema.get('type'))[:40]}", param, "invalid_value")
    try:
        from_json_schema(schema)
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
