"""Tools -> the chat template's call form, as one llguidance Lark grammar.

A request's tools (functions whose parameters are JSON Schemas), its tool choice and whether
calls may come in parallel become a grammar in the form the model was trained to call in, which
its chat template spells out. Three forms (`CallForm.kind`):
- "tags", Hermes's, which Qwen2.5 (and Qwen3, Hermes) use, calls separated by a newline:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

- "json", Llama 3.x's: one bare `{"name": "get_weather", "parameters": {"city": "Paris"}}`, read back
  as a call written in the text (textcalls.py);
- "generic", for every other template (one that spells no call, as SmolLM2's ChatML, or one whose
  form is not read here): llama-server's generic format, the whole answer one JSON object, a call or
  a reply (generic.py; its prompt side: tools described in the system message).

The arguments are embedded with llguidance's `%json`, so
they follow that tool's schema; the wrapper and the name are forced (and so drafted for free).
The choice: "none" -> text without a call; "auto" -> text, or text then calls (in the template's
form, or written as JSON in the text: textcalls.py); "required" -> one or more calls; a function's
name -> exactly one call of it. Not parallel -> at most one call.
Each API's adapter reads its own spelling of tools into `ToolSpec`s (OpenAI's
`{"type": "function", "function": {...}}`, Anthropic's `{"name", "input_schema"}`); errors name
the field by the path the adapter gives. `tool_request` checks on the event loop what is cheap to
check (how many tools, their names, the call form); `tools_grammar` reads the parameters' schemas
against the limits and writes the grammar, on a grammar worker with the compile (compiling.py):
reading 5,000 properties takes 0.1 s, which the event loop does not wait for.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ....grammar import GrammarError, from_json_schema, from_lark
from ....grammar.limits import MAX_TOOLS, check_schema, limit_error
from ....grammar.sources import JSON_LAYOUT
from ...http.errors import bad_request
from .generic import generic_chat, generic_lark
from .structured import grammar_error

NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI's rule for function names (Anthropic's too)
_TEMPLATE_KEY = "tokenizer.chat_template"
_ATTR_CONTROL, _ATTR_USER_DEFINED = 1 << 3, 1 << 4


@dataclass(frozen=True)
class CallForm:
    """How a model's template spells a call. kind "tags": the tags around `{"name": ..., "arguments": ...}`;
    `special`: the tags are single control-like tokens (a text lexeme cannot spell them). "json" and
    "generic" use no tags (the module docstring)."""

    open: str = "<tool_call>"
    close: str = "</tool_call>"
    special: bool = True
    kind: str = "tags"

    def describe(self) -> str:
        """The form in words, for the start-up log and /props."""
        return {"tags": "Hermes's <tool_call> JSON </tool_call> (Qwen2.5, Qwen3, Hermes)",
                "json": 'Llama 3.x\'s bare JSON {"name": ..., "parameters": ...}',
                "generic": 'generic JSON, as llama-server\'s generic format: {"tool_call": ...} or {"response": ...}, '
                           "the tools described in the system message"}[self.kind]

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
    specs: tuple[ToolSpec, ...]  # their parameters, which tools_grammar reads


JSON_FORM = CallForm(open="", close="", special=False, kind="json")
GENERIC_FORM = CallForm(open="", close="", special=False, kind="generic")


def call_form(model) -> CallForm:
    """The call form the model's chat template spells: Hermes's tags, Llama 3.x's bare JSON (the template
    writes a past call as `{"name": ..., "parameters": ...}` and answers in an ipython turn, as llama.cpp
    tells Llama 3.x), or else the generic form."""
    template = model.metadata.get(_TEMPLATE_KEY) or ""
    if "tools" in template and "<tool_call>" in template:
        return CallForm(special=all(_single_special(model, tag) for tag in ("<tool_call>", "</tool_call>")))
    if "tools" in template and '"parameters": ' in template and "ipython<|end_header_id|>" in template:
        return JSON_FORM
    return GENERIC_FORM


def _single_special(model, text: str) -> bool:
    """Whether `text` is one token that llguidance treats as special (a control token, or a
    user-defined one spelled like a tag, as llguidance's llama.cpp tokenizer marks them)."""
    ids = model.tokenize(text, add_special=False, parse_special=True)
    if len(ids) != 1:
        return False
    attr = model.vocab.token_attrs[ids[0]]
    return bool(attr & _ATTR_CONTROL or attr & _ATTR_USER_DEFINED and text.startswith("<") and text.endswith(">"))


def tool_request(model, template_tools: list[dict], specs: list[ToolSpec], choice: str,
                 parallel: bool) -> ToolRequest:
    """The tools as a ToolRequest: the template's call form and the calls `choice` allows (a name in
    `specs`, or "none", "auto", "required"); their grammar is `tools_grammar`'s. Raises ApiError(400)
    naming the field."""
    if len(specs) > MAX_TOOLS:
        raise grammar_error(limit_error("tools", f"holds {len(specs):,}", MAX_TOOLS, "tools in a request"), "tools")
    names = tuple(s.name for s in specs)
    for i, spec in enumerate(specs):
        if spec.name in names[:i]:
            raise bad_request(f"{spec.name_param}: {spec.name!r} is given twice", spec.name_param)
    form = call_form(model)
    # Llama 3.x's template renders one call a turn (it raises on more), and llama-server asks for one
    parallel = parallel and form.kind != "json"
    return ToolRequest(list(template_tools), names, choice, parallel, form, tuple(specs))


def template_input(model, messages, tools: ToolRequest | list | None) -> tuple[list, list | None]:
    """What the chat template gets of a chat: its messages and tools (a request's ToolRequest, or the
    tools as sent where nothing asks for calls: /apply-template, token counts). A template in the generic
    form renders neither: the tools are described in the system message, and past calls and results are
    written as the generic form's JSON (generic.py). Other templates get both as they were sent."""
    raw = tools.tools if isinstance(tools, ToolRequest) else tools
    history = isinstance(messages, list) and any(
        isinstance(m, dict) and (m.get("role") == "tool" or m.get("tool_calls")) for m in messages)
    if not raw and not history:
        return messages, raw
    form = tools.form if isinstance(tools, ToolRequest) else call_form(model)
    if form.kind != "generic":
        return messages, raw
    choice, parallel = (tools.choice, tools.parallel) if isinstance(tools, ToolRequest) else ("auto", False)
    return generic_chat(messages, raw, choice, parallel, model.metadata.get(_TEMPLATE_KEY) or ""), None


def tools_grammar(tools: ToolRequest) -> str | None:
    """The grammar of the calls the tools' choice allows, each tool's parameters checked against the
    limits (a 400 naming the tool) and all of them together; not compiled: that is done once, for the
    target (structured.compiled). None under tool_choice "none" in the generic form (nothing to constrain: the
    answer is text). Raises ApiError(400)."""
    if tools.form.kind == "generic" and tools.choice == "none":
        return None
    schemas = [arguments_schema(s.parameters, s.parameters_param) for s in tools.specs]
    try:
        check_schema({"anyOf": schemas}, "the tools' parameters together")  # each was checked on its own
    except GrammarError as e:
        raise grammar_error(e, "tools") from None
    if tools.form.kind == "generic":
        lark = generic_lark(tools.names, schemas, tools.choice, tools.parallel)
    else:
        lark = tools_lark(tools.form, tools.names, schemas, tools.choice, tools.parallel)
    return from_lark(lark, validate=False, limit=False)  # written here around checked schemas


def name_the_tool(tools: ToolRequest) -> None:
    """400 naming the tool whose parameters llguidance refuses (asked only once the tools' grammar
    failed to compile: each schema is then compiled on its own)."""
    for spec in tools.specs:
        try:
            from_json_schema(arguments_schema(spec.parameters, spec.parameters_param))
        except GrammarError as e:
            raise bad_request(f"{spec.parameters_param}: {e}", spec.parameters_param, "invalid_grammar") from None


def arguments_schema(parameters: dict | None, param: str) -> dict:
    """The tool's parameters schema, checked on its own (so the 400 names the tool: `param`), in the
    template's JSON layout."""
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


# A call written as JSON in the text (textcalls.py): at a line's start, after an optional fence line,
# `{"name": "NAME"` with blanks anywhere between; from there the grammar takes over.
_WS = r"[ \t\r\n]*"
_LINE = r"((.|\n)*\n)?[ \t]*(```[A-Za-z0-9_+-]*[ \t]*\n[ \t]*)?"


def _named(names: str) -> str:
    """The regex of a text call's start up to the closing quote of one of `names` (a regex)."""
    return _LINE + r"\{" + _WS + '"name"' + _WS + ":" + _WS + f'"({names})"'


def _text_calls(names: tuple[str, ...], schemas: list[dict], tagless: str) -> list[str]:
    """Rules `tcall` (one call written as JSON in the text, lazily ended at its start by the declared
    name; the text before it `tagless`, as TEXT) and FENCE (a fenced block's close)."""
    lines = []
    for i, (name, schema) in enumerate(zip(names, schemas)):
        loose = {**schema, "x-guidance": {"whitespace_flexible": True}}  # blanks as the model likes them
        lines.append(f"tcall_{i}: pre_{i} rest_{i}")
        lines.append(f"pre_{i}[lazy]: /{_named(re.escape(name))}/{tagless}")
        lines.append(f'rest_{i}: /{_WS},{_WS}"(arguments|parameters)"{_WS}:{_WS}/ targs_{i} /{_WS}\\}}/')
        lines.append(f"targs_{i}: %json {json.dumps(loose, ensure_ascii=False)}")
    lines.append("tcall: " + " | ".join(f"tcall_{i}" for i in range(len(names))))
    lines.append(f"FENCE: /{_WS}```/")
    return lines


def tools_lark(form: CallForm, names: tuple[str, ...], schemas: list[dict], choice: str, parallel: bool) -> str:
    """The Lark grammar for these tools in this call form, under this choice. Under "auto" a call may
    also be written as JSON in the text (textcalls.py): from its declared name on, the arguments follow
    the tool's schema."""
    tag = (lambda t: t) if form.special else _lit  # a special token is named bare: <tool_call>
    lines = []
    for i, (name, schema) in enumerate(zip(names, schemas)):
        if form.kind == "json":  # Llama 3.x's: the call is the JSON alone, its arguments named `parameters`
            head = _lit('{"name": "' + name + '", "parameters": ')
            lines.append(f'call_{i}: {head} args_{i} "}}"')
        else:
            lines.append(f"call_{i}: {tag(form.open)} {_lit(form.prefix + name + form.middle)} args_{i} "
                         f"{_lit(form.suffix[:-len(form.close)])} {tag(form.close)}")
        lines.append(f"args_{i}: %json {json.dumps(schema, ensure_ascii=False)}")
    lines.append("call: " + " | ".join(f"call_{i}" for i in range(len(names))))
    lines.append('calls: call ("\\n" call)*' if parallel else "calls: call")
    not_a_call = f" & ~/{_named('|'.join(re.escape(n) for n in names))}(.|\\n)*/" if choice == "auto" else ""
    if form.kind == "json":  # no tag: under "auto" the call is a call written in the text (below)
        tagless = ""
    elif form.special:  # text is bytes, a special token is not; nor may TEXT spell the open tag in plain
        # tokens, which the reader (toolcalls.py), reading text, would take for a call
        tagless = f" & ~/(.|\\n)*{re.escape(form.open)}(.|\\n)*/"
    else:  # the tags are plain text: a TEXT may not start with the open tag
        tagless = f" & ~/{re.escape(form.open)}(.|\\n)*/"
    lines.append(f"TEXT: /(.|\\n)+/{tagless}{not_a_call}")
    if choice == "none":
        start = "TEXT?"
    elif choice == "auto":
        written = "tcall (FENCE? tcall)* FENCE? TEXT?" if parallel else "tcall FENCE?"
        start = ("TEXT | TEXT? calls" if form.special else "TEXT" if form.kind == "json" else "TEXT | calls") \
            + f" | {written}"
        lines += _text_calls(names, schemas, tagless)
    elif choice == "required":
        start = "calls"
    else:
        start = f"call_{names.index(choice)}"
    return "\n".join([f"start: {start}", *lines]) + "\n"
