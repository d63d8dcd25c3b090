"""Constraint fields of a request -> one llguidance grammar, or a 400 naming what is wrong.

Where clients send a constraint: OpenAI's `response_format` (text, json_object, json_schema),
llama-server's `grammar` (GBNF) and `json_schema` (a schema object), and OpenAI's `tools`
(server/tools.py builds their grammar). A request may carry one of them; two that would each
constrain the output are refused with both names, rather than one silently winning.
"""
from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..grammar import GrammarError, from_gbnf, from_json_schema, json_object
from .errors import ApiError, bad_request

CONSTRAINT_FIELDS = ("response_format", "grammar", "json_schema")


class StrictModel(BaseModel):
    """A request object as OpenAI checks it: unknown fields and wrong types are refused, not coerced."""

    model_config = ConfigDict(extra="forbid", strict=True)


class JsonSchemaFormat(StrictModel):
    name: str | None = None
    description: str | None = None
    schema_: dict | bool | None = Field(None, alias="schema")  # `schema` would shadow BaseModel.schema
    strict: bool | None = None  # llguidance enforces the schema either way


class ResponseFormat(StrictModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


def field_error(e: ValidationError, param: str) -> ApiError:
    """A pydantic error as OpenAI's 400: the first problem, its place spelled `a.b[0].c`."""
    err = e.errors()[0]
    where = param
    for part in err["loc"]:
        where += f"[{part}]" if isinstance(part, int) else f".{part}"
    where = where.replace(".schema_", ".schema")
    kind = err["type"]
    if kind == "missing":
        return bad_request(f"Missing required parameter: '{where}'", where, "missing_required_parameter")
    if kind == "extra_forbidden":
        return bad_request(f"Unknown parameter: '{where}'", where, "unknown_parameter")
    shown = json.dumps(err.get("input"), ensure_ascii=False)[:60] if "input" in err else ""
    return bad_request(f"Invalid value for '{where}': {err['msg']}" + (f" (got {shown})" if shown else ""), where,
                       "invalid_value")


def parse(model: type[BaseModel], value, param: str):
    try:
        return model.model_validate(value)
    except ValidationError as e:
        raise field_error(e, param) from None


def grammar_error(e: GrammarError, param: str) -> ApiError:
    return bad_request(f"{param}: {e}", param, "invalid_grammar")


def _response_format(value) -> str | None:
    fmt = parse(ResponseFormat, value, "response_format")
    if fmt.type == "text":
        if fmt.json_schema is not None:
            raise bad_request("response_format.json_schema goes with type 'json_schema', not 'text'",
                              "response_format.json_schema")
        return None
    if fmt.type == "json_object":
        return json_object(validate=False)
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        param = "response_format.json_schema" + (".schema" if fmt.json_schema is not None else "")
        raise bad_request(f"Missing required parameter: '{param}'", param, "missing_required_parameter")
    try:
        return from_json_schema(fmt.json_schema.schema_, validate=False)
    except GrammarError as e:
        raise grammar_error(e, "response_format.json_schema.schema") from None


def requested(body: dict) -> list[str]:
    """The constraint fields the body sets to something that constrains (`{"type": "text"}` does not)."""
    out = []
    for key in CONSTRAINT_FIELDS:
        value = body.get(key)
        if value is None or (key == "response_format" and value == {"type": "text"}):
            continue
        if key == "grammar" and value == "":  # llama-server's default: no grammar
            continue
        out.append(key)
    return out


def source_of(body: dict) -> tuple[str, str]:
    """(the field, what it holds) of the body's constraint, for the errors found compiling it."""
    keys = requested(body)
    key = keys[0] if keys else "tools"
    if key == "response_format":
        fmt = body[key].get("type") if isinstance(body[key], dict) else None
        return ("response_format.json_schema.schema", "JSON schema") if fmt == "json_schema" else \
            ("response_format", "JSON schema")
    return key, {"grammar": "GBNF grammar", "json_schema": "JSON schema", "tools": "tools grammar"}[key]


def refuse_constraints(body: dict, endpoint: str) -> None:
    """400 `unsupported_parameter` for a constraint or tools on an endpoint that takes none (/infill)."""
    keys = requested(body) + [k for k in ("tools", "tool_choice") if body.get(k) not in (None, [], "none", "auto")]
    if keys:
        raise bad_request(f"{keys[0]} is not supported on /{endpoint}", keys[0], "unsupported_parameter")


def conflict(first: str, second: str) -> ApiError:
    return bad_request(f"{first} and {second} both constrain the output: give one of them", second,
                       "conflicting_parameters")


def constraint(body: dict) -> str | None:
    """The grammar the body's constraint fields ask for (None: unconstrained), checked against the
    limits but not compiled (compiled.py does that, once). Raises ApiError(400)."""
    keys = requested(body)
    if len(keys) > 1:
        raise conflict(keys[0], keys[1])
    if body.get("response_format") is not None:  # also checks a {"type": "text"} that is malformed
        grammar = _response_format(body["response_format"])
        if grammar is not None:
            return grammar
    if not keys or keys[0] == "response_format":
        return None
    key, value = keys[0], body[keys[0]]
    if key == "grammar":
        if not isinstance(value, str):
            raise bad_request(f"grammar must be a string (GBNF), got {json.dumps(value)[:40]}", "grammar")
        try:
            return from_gbnf(value, validate=False)
        except GrammarError as e:
            raise grammar_error(e, "grammar") from None
    if not isinstance(value, (dict, bool)):  # `true` is a schema too: any JSON value
        raise bad_request(f"json_schema must be a JSON Schema (an object or a boolean), got {json.dumps(value)[:40]}",
                          "json_schema")
    try:
        return from_json_schema(value, validate=False)
    except GrammarError as e:
        raise grammar_error(e, "json_schema") from None


def finish_detail(stats, cut: str | None = None) -> dict:
    """The choice's `finish_detail` (a specserve extension), where the finish_reason alone would not
    say why the answer ended as it did: a tool call cut short. (A grammar with no way forward is an
    error, not an answer: jobs.dead_end.)"""
    if cut and stats.finish_reason == "length":
        return {"finish_detail": f"{cut} when max_tokens ended the answer"}
    if cut:
        return {"finish_detail": cut}
    return {}
