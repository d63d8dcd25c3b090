"""The fields that constrain output on OpenAI's and llama-server's endpoints -> one grammar, or a 400.

Where clients send a constraint: OpenAI's `response_format` (text, json_object, json_schema),
llama-server's `grammar` (GBNF) and `json_schema` (a schema object), and OpenAI's `tools`
(openai/tools.py reads them; core/constraints/tools.py builds their grammar). A request may carry one
of them; two that would each constrain the output are refused with both names, rather than one
silently winning. A request with a constraint or tools has them read and compiled on a grammar worker,
off the event loop, within a time budget (core/constraints/compiling.py): a large schema takes
seconds to compile, and /health and every stream go on meanwhile.
"""
from __future__ import annotations

import json
from typing import Literal

from pydantic import Field, field_validator

from ....grammar import CompiledGrammar
from ...core.constraints.compiling import compile_off_loop
from ...core.constraints.structured import compiled, conflict, gbnf_grammar, json_object, schema_grammar
from ...core.constraints.tools import ToolRequest, name_the_tool, tools_grammar
from ...http.errors import ApiError, bad_request
from .validation import Fields, StrictModel

CONSTRAINT_FIELDS = ("response_format", "grammar", "json_schema")
_HOLDS = {"grammar": "GBNF grammar", "json_schema": "JSON schema", "response_format": "JSON schema",
          "tools": "tools grammar"}  # what each field holds, for the errors found compiling it


def _a_schema(value, param: str, code: str | None = None):
    """A JSON Schema is an object or a boolean (`true`: any JSON value, `false`: none)."""
    if value is not None and not isinstance(value, (dict, bool)):
        raise bad_request(f"{param} must be a JSON Schema (an object or a boolean), got {json.dumps(value)[:40]}",
                          param, code)
    return value


class JsonSchemaFormat(StrictModel):
    name: str | None = None
    description: str | None = None
    schema_: dict | bool | None = Field(None, alias="schema")  # `schema` would shadow BaseModel.schema
    strict: bool | None = None  # llguidance enforces the schema either way

    @field_validator("schema_", mode="before")
    @classmethod
    def _schema(cls, value):
        return _a_schema(value, "response_format.json_schema.schema", "invalid_value")


class ResponseFormat(StrictModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None
    schema_: dict | bool | None = Field(None, alias="schema")  # llama-server's: json_object with a schema

    @field_validator("schema_", mode="before")
    @classmethod
    def _schema(cls, value):
        return _a_schema(value, "response_format.schema", "invalid_value")


class ConstraintFields(Fields):
    """The constraint fields of a body (OpenAI's response_format; llama-server's grammar and json_schema)."""

    response_format: ResponseFormat | None = None
    grammar: str | None = None
    json_schema: dict | bool | None = None

    @field_validator("json_schema", mode="before")
    @classmethod
    def _json_schema(cls, value):
        return _a_schema(value, "json_schema")

    def requested(self) -> list[str]:
        """The fields set to something that constrains (`{"type": "text"}` and `""` do not)."""
        rf = self.response_format
        out = [] if rf is None or rf.type == "text" and rf.json_schema is None and rf.schema_ is None \
            else ["response_format"]
        if self.grammar:  # llama-server's default "": no grammar
            out.append("grammar")
        if self.json_schema is not None:
            out.append("json_schema")
        return out

    def source(self) -> tuple[str, str]:
        """(the field, what it holds) of the constraint, for the errors found compiling it ("tools": none)."""
        keys = self.requested()
        key = keys[0] if keys else "tools"
        if key == "response_format" and self.response_format.type == "json_schema":
            return "response_format.json_schema.schema", _HOLDS[key]
        if key == "response_format" and self.response_format.schema_ is not None:
            return "response_format.schema", _HOLDS[key]
        return key, _HOLDS[key]


def refuse_constraints(body: dict, fields: ConstraintFields, endpoint: str) -> None:
    """400 `unsupported_parameter` for a constraint or tools on an endpoint that takes none (/infill)."""
    keys = fields.requested() + [k for k in ("tools", "tool_choice") if body.get(k) not in (None, [], "none", "auto")]
    if keys:
        raise bad_request(f"{keys[0]} is not supported on /{endpoint}", keys[0], "unsupported_parameter")


def _response_format(fmt: ResponseFormat) -> str | None:
    if fmt.type == "text" and fmt.schema_ is not None:
        raise bad_request("response_format.schema goes with type 'json_object'", "response_format.schema")
    if fmt.type == "text":
        if fmt.json_schema is not None:
            raise bad_request("response_format.json_schema goes with type 'json_schema', not 'text'",
                              "response_format.json_schema")
        return None
    if fmt.type == "json_object" and fmt.schema_ is not None:
        return schema_grammar(fmt.schema_, "response_format.schema")
    if fmt.type == "json_object":
        return json_object(validate=False)
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        param = "response_format.json_schema" + (".schema" if fmt.json_schema is not None else "")
        raise bad_request(f"Missing required parameter: '{param}'", param, "missing_required_parameter")
    return schema_grammar(fmt.json_schema.schema_, "response_format.json_schema.schema")


def constraint(fields: ConstraintFields) -> str | None:
    """The grammar the constraint fields ask for (None: unconstrained). Raises ApiError(400)."""
    keys = fields.requested()
    if len(keys) > 1:
        raise conflict(keys[0], keys[1])
    if fields.response_format is not None:  # also checks a {"type": "text"} that is malformed
        grammar = _response_format(fields.response_format)
        if grammar is not None:
            return grammar
    if not keys or keys[0] == "response_format":
        return None
    if keys[0] == "grammar":
        return gbnf_grammar(fields.grammar, "grammar")
    return schema_grammar(fields.json_schema, "json_schema")


async def output_grammar(server, fields: ConstraintFields, tools: ToolRequest | None = None,
                        own: tuple[str, str] | None = None) -> CompiledGrammar | None:
    """The one grammar of a request: its constraint fields' or its tools', compiled for the target's
    vocabulary on the server's grammar worker (server: builder.ServerView). Tools that may call (tool_choice other
    than "none") and a constraint are refused together. own: (param, grammar text) of a JSON schema in
    the API's own field (Responses' `text.format`, Anthropic's `output_config.format`), refused beside
    any other. Raises ApiError(400) naming the field."""
    if tools is None and not fields.requested() and own is None:
        return constraint(fields)  # None; a malformed {"type": "text"} is still refused
    param = own[0] if own is not None else fields.source()[0]
    return await compile_off_loop(server.grammars, param, _output_grammar, server, fields, tools, own)


def _output_grammar(server, fields: ConstraintFields, tools: ToolRequest | None,
                    own: tuple[str, str] | None = None) -> CompiledGrammar | None:
    """output_grammar's work, on a grammar worker thread."""
    keys = fields.requested() + ([own[0]] if own is not None else [])
    tools_text = tools_grammar(tools) if tools is not None else None  # each tool's schema checked first
    if tools is not None and tools.choice != "none" and keys:
        raise conflict("tools", keys[0])
    if len(keys) > 1:
        raise conflict(keys[0], keys[1])
    grammar = constraint(fields) if own is None else own[1]
    if grammar is None:
        grammar = tools_text
    if grammar is None:
        return None
    param, what = fields.source() if own is None else (own[0], "JSON schema")
    try:
        return compiled(server, grammar, what, param)
    except ApiError:
        if param == "tools":
            name_the_tool(tools)  # a 400 naming the tool whose parameters llguidance refuses
        raise
