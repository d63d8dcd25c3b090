"""Request bodies checked by pydantic models, and pydantic's findings as one 400 that names the field.

Two kinds of model, as the server has always checked them:
- `Fields`, a request body or one of our own objects (`speculative`): unknown fields are left to
  the endpoint (most are ignored; the unsupported ones refused by `fields.check_unsupported`), types
  are checked strictly (no "10" for 10, no true for 1; an integer is a number) and a wrong one is
  `400 "temperature must be a number, got \"hot\""`, param = the field, no code.
- `StrictModel`, an object of OpenAI's that OpenAI checks strictly (`response_format`, a tool):
  unknown fields are refused too, and the codes are OpenAI's (`missing_required_parameter`,
  `unknown_parameter`, `invalid_value`).
The field is named by its path (`tools[0].function.name`). A validator that needs its own words
raises `ApiError` itself: pydantic lets it through unchanged.
"""
from __future__ import annotations

import json
import types
import typing
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from ...http.errors import ApiError, bad_request

_KINDS = {"int_type": "an integer", "float_type": "a number", "bool_type": "a boolean", "string_type": "a string",
          "list_type": "an array", "dict_type": "an object", "model_type": "an object"}


class Fields(BaseModel):
    """A request body (or our own object in one): strict types, unknown fields kept for the endpoint."""

    model_config = ConfigDict(extra="allow", strict=True)
    strict_errors: ClassVar[bool] = False  # errors in OpenAI's strict style (StrictModel)


class StrictModel(BaseModel):
    """An object as OpenAI checks it: unknown fields and wrong types are refused, not coerced."""

    model_config = ConfigDict(extra="forbid", strict=True)
    strict_errors: ClassVar[bool] = True


def parse(model: type[BaseModel], value, param: str = ""):
    """`value` validated as `model` (its path in the body: `param`); 400 naming the field otherwise."""
    try:
        return model.model_validate(value)
    except ValidationError as e:
        raise field_error(e, model, param) from None


def field_error(e: ValidationError, model: type[BaseModel], param: str = "") -> ApiError:
    """The first problem pydantic found, as the 400 of the model's kind (see the module docstring)."""
    err = e.errors()[0]
    where = param
    for part in err["loc"]:
        where += f"[{part}]" if isinstance(part, int) else f".{part}" if where else str(part)
    where = where.replace(".schema_", ".schema")
    kind = err["type"]
    shown = json.dumps(err.get("input"), ensure_ascii=False)[:60] if "input" in err else ""
    if _owner(model, err["loc"]).strict_errors:
        if kind == "missing":
            return bad_request(f"Missing required parameter: '{where}'", where, "missing_required_parameter")
        if kind == "extra_forbidden":
            return bad_request(f"Unknown parameter: '{where}'", where, "unknown_parameter")
        return bad_request(f"Invalid value for '{where}': {err['msg']}" + (f" (got {shown})" if shown else ""), where,
                           "invalid_value")
    if kind in _KINDS:
        return bad_request(f"{where} must be {_KINDS[kind]}, got {json.dumps(err.get('input'))[:80]}", where)
    if kind == "missing":
        return bad_request(f"{where} is required", where)
    if kind == "extra_forbidden":
        return bad_request(f"{where} is unknown", where)
    return bad_request(f"Invalid value for '{where}': {err['msg']}" + (f" (got {shown})" if shown else ""), where)


def _owner(model: type[BaseModel], loc: tuple) -> type[BaseModel]:
    """The model class holding the field where the error is (the body's model, or one nested in it)."""
    owner, node = model, model
    for part in loc[:-1]:
        node = _inner(node, part)
        if isinstance(node, type) and issubclass(node, BaseModel):
            owner = node
    return owner


def _inner(node, part):
    """The type found at `part` (a field name, or a list index) of `node`."""
    if isinstance(part, int):
        args = typing.get_args(node)
        return _unwrap(args[0]) if args else None
    if isinstance(node, type) and issubclass(node, BaseModel):
        for name, f in node.model_fields.items():
            if part in (name, f.alias):
                return _unwrap(f.annotation)
    return None


def _unwrap(tp):
    """X for `X | None`."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp
