"""Constraint sources -> llguidance grammar strings (the form `llguidance.LLMatcher` takes).

Every function first checks the source against the limits (limits.py: size, rules, depth,
properties, $refs), then, unless told `validate=False`, checks what it builds with llguidance
itself (`LLMatcher.validate_grammar`, no tokenizer needed), and raises GrammarError, a
ValueError whose message says what is wrong: a limit passed, invalid JSON, a Lark or GBNF syntax
error with its line, or the schema keywords llguidance does not implement (it names them). The
server passes `validate=False`: it compiles once, for the target's vocabulary (compiled.py), and
that reports the same errors. Nothing here converts schemas or grammars by hand: JSON Schema and
Lark go to llguidance's compilers, GBNF through its GBNF -> Lark converter.
"""
from __future__ import annotations

import json

import llguidance
from llguidance.gbnf_to_lark import gbnf_to_lark

from .limits import GrammarError, check_grammar_text, check_schema

LARK_MARK = "%llguidance"  # a Lark grammar in llguidance's dialect starts with this line


# JSON as `json.dumps` writes it ({"a": 1, "b": [2, 3]}): no free whitespace, so a model cannot
# wander into blank runs, and the separators and key quotes become forced tokens (drafted for free).
# A schema's own "x-guidance" options override it (llguidance applies defaults, then the schema's).
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def from_json_schema(schema: dict | bool | str, validate: bool = True) -> str:
    """The grammar of the JSON texts that validate against `schema` (a dict or boolean, or its JSON text)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except (json.JSONDecodeError, RecursionError) as e:
            raise GrammarError(f"JSON schema is not valid JSON: {e}") from None
    if isinstance(schema, bool):  # true: any JSON value; false: nothing validates
        if not schema:
            raise GrammarError("JSON schema `false` allows no value")
        schema = {}
    if not isinstance(schema, dict):
        raise GrammarError(f"JSON schema must be an object, got {type(schema).__name__}")
    check_schema(schema)
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)
    except (ValueError, TypeError) as e:
        raise GrammarError(f"invalid JSON schema: {e}") from None
    return check(grammar, "JSON schema") if validate else grammar


def json_object(validate: bool = True) -> str:
    """Any JSON object (OpenAI's response_format {"type": "json_object"})."""
    return from_json_schema({"type": "object"}, validate)


def from_lark(text: str, validate: bool = True, limit: bool = True) -> str:
    """A Lark grammar (llguidance's dialect: `start` is the start rule; /regex/ and %json allowed).
    limit=False: a grammar this package wrote itself around checked schemas (tools), not a client's."""
    if not isinstance(text, str) or not text.strip():
        raise GrammarError("Lark grammar is empty")
    if limit:
        check_grammar_text(text, "Lark grammar", lark=True)
    grammar = llguidance.LLMatcher.grammar_from_lark(text)
    return check(grammar, "Lark grammar") if validate else grammar


def from_gbnf(text: str, validate: bool = True) -> str:
    """A GBNF grammar (llama.cpp's, as llama-server takes it: `root ::= ...`)."""
    if not isinstance(text, str) or not text.strip():
        raise GrammarError("GBNF grammar is empty")
    check_grammar_text(text, "GBNF grammar", lark=False)
    try:
        lark = gbnf_to_lark(text)
    except Exception as e:  # the converter raises what its parser meets (RecursionError too): the user's error
        raise GrammarError(f"invalid GBNF grammar: {type(e).__name__ if isinstance(e, RecursionError) else e}") \
            from None
    grammar = llguidance.LLMatcher.grammar_from_lark(lark)
    return check(grammar, "GBNF grammar") if validate else grammar


def from_grammar_text(text: str, name: str = "") -> str:
    """A grammar file's text: Lark when it starts with `%llguidance` or its name ends .lark, else GBNF."""
    if text.lstrip().startswith(LARK_MARK) or name.endswith(".lark"):
        return from_lark(text)
    return from_gbnf(text)


def check(grammar: str, what: str = "grammar", tokenizer=None) -> str:
    """`grammar` if llguidance can build a matcher from it (for `tokenizer`'s vocabulary when given);
    else GrammarError with llguidance's reason."""
    error = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
    if error:
        raise GrammarError(f"invalid {what}: {reason(error)}")
    return grammar


def reason(error: str, first_line: bool = False) -> str:
    """llguidance's message, its keyword complaint put plainly; a panic's (or, with first_line, any
    message's) first line only: what follows is a backtrace or the parser's state."""
    error = (error or "unknown error").strip()
    if "Unimplemented keys" in error:
        return "unsupported JSON Schema keyword(s) " + error.split("Unimplemented keys:", 1)[1].strip()
    if first_line or error.startswith("panic"):
        return error.splitlines()[0]
    return error
