"""The fields that constrain output on OpenAI's and llama-server's endpoints -> one grammar, or a 400.

Where clients send a constraint: OpenAI's `response_format` (text, json_object, json_schema),
llama-server's `grammar` (GBNF) and `json_schema` (a schema object), and OpenAI's `tools`
(openai_tools.py reads them; core/constraints/tools.py builds their grammar). A request may carry one
of them; two that would each constrain the output are refused with both names, rather than one
silently winning.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..core.constraints.structured import check_usable, conflict, gbnf_grammar, json_object, schema_grammar
from ..core.constraints.tools import ToolRequest
from ..http.errors import bad_request
from .validation import Fields, StrictModel

CONSTRAINT_FIELDS = ("response_format", "grammar", "json_schema")


class JsonSchemaFormat(StrictModel):
    name: str | None = None
    description: str | None = None
    schema_: dict | None = Field(None, alias="schema")  # `schema` would shadow BaseModel.schema
    strict: bool | None = None  # llguidance enforces the schema either way


class ResponseFormat(StrictModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None
    schema_: dict | None = Field(None, alias="schema")  # llama-server's: json_object with a schema


class ConstraintFields(Fields):
    """The constraint fields of a body (OpenAI's response_format; llama-server's grammar and json_schema)."""

    response_format: ResponseFormat | None = None
    grammar: str | None = None
    json_schema: dict | None = None

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


def refuse_constraints(body: dict, fields: ConstraintFields, endpoint: str) -> None:
    """400 `unsupported_parameter` for a constraint or tools on an endpoint that takes none (/infill)."""
    keys = fields.requested() + [k for k in ("tools", "tool_choice") if body.get(k) not in (None, [], "none", "auto")]
    if keys:
        raise bad_request(f"{keys[0]} is not supported on /{endpoint}", keys[0], "unsupported_parameter")


def refuse_tools(body: dict) -> None:
    """400 `unsupported_parameter` for tools on an endpoint without chat (they are read back from a chat)."""
    if body.get("tools") or body.get("tool_choice") not in (None, "none", "auto"):
        raise bad_request("tools are for /v1/chat/completions", "tools", "unsupported_parameter")


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
        return json_object()
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


async def output_grammar(engine, fields: ConstraintFields, tools: ToolRequest | None = None) -> str | None:
    """The one grammar of a request: its constraint fields' or its tools', checked against the target's
    tokenizer. Tools that may call (tool_choice other than "none") and a constraint are refused together."""
    keys = fields.requested()
    if tools is not None and tools.choice != "none" and keys:
        raise conflict("tools", keys[0])
    grammar = constraint(fields)
    param = keys[0] if keys else "tools"
    if grammar is None and tools is not None:
        grammar = tools.grammar
    if grammar is not None:
        await check_usable(engine, grammar, param)
    return grammar
