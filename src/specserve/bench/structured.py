"""Structured-output runs in the bench: the grammar a prompt's JSON Schema gives, and whether an
output validates against it (`jsonschema`). A configuration's `valid` is the share of its runs on
prompts with a schema whose output parses and validates (None: no such prompt)."""
from __future__ import annotations

import json
from functools import lru_cache

import jsonschema

from ..grammar import from_json_schema


@lru_cache(maxsize=256)
def _grammar(schema_json: str) -> str:
    return from_json_schema(schema_json)


def grammar_for(schema: dict) -> str:
    """The llguidance grammar of a JSON Schema, compiled once per schema."""
    return _grammar(json.dumps(schema, sort_keys=True))


def validates(text: str, schema: dict) -> bool:
    """Whether `text` is one JSON value (surrounding whitespace allowed) that validates against `schema`."""
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError, jsonschema.SchemaError):
        return False
    return True


def valid_share(stats: list[dict]) -> float | None:
    """The share of runs whose output validated, among those that carried a schema."""
    marks = [s["valid"] for s in stats if s.get("valid") is not None]
    return round(sum(marks) / len(marks), 4) if marks else None
