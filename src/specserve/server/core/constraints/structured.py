"""Output constraints as the core takes them: one llguidance grammar, whatever field gave it.

An adapter reads its API's constraint fields (OpenAI's `response_format`, llama-server's `grammar`
and `json_schema`, the tools of any API) into grammar text here, checked against the limits
(grammar/limits.py) but not compiled; `compiled` then compiles it once, for the target's vocabulary,
on a grammar worker (compiling.py), and the engine copies that matcher instead of compiling again.
Each failure is a 400 naming the field it came from (`param`, the adapter's path). A request may
carry one constraint: two that would each constrain the output are refused with both names
(`conflict`), rather than one silently winning.
"""
from __future__ import annotations

from ....grammar import CompiledGrammar, GrammarError, compile_grammar, from_gbnf, from_json_schema, json_object
from ...http.errors import ApiError, bad_request

__all__ = ["compiled", "conflict", "gbnf_grammar", "grammar_error", "json_object", "schema_grammar"]


def grammar_error(e: GrammarError, param: str) -> ApiError:
    return bad_request(f"{param}: {e}", param, "invalid_grammar")


def schema_grammar(schema: dict | bool, param: str) -> str:
    """The grammar of a JSON Schema (`true`: any JSON value); 400 `invalid_grammar` naming `param` if it
    is past a limit or not one llguidance takes (the latter found by `compiled`)."""
    try:
        return from_json_schema(schema, validate=False)
    except GrammarError as e:
        raise grammar_error(e, param) from None


def gbnf_grammar(text: str, param: str) -> str:
    """The grammar of a GBNF text (llama.cpp's); 400 `invalid_grammar` naming `param`."""
    try:
        return from_gbnf(text, validate=False)
    except GrammarError as e:
        raise grammar_error(e, param) from None


def conflict(first: str, second: str) -> ApiError:
    return bad_request(f"{first} and {second} both constrain the output: give one of them", second,
                       "conflicting_parameters")


def compiled(server, grammar: str, what: str, param: str) -> CompiledGrammar:
    """The grammar compiled for the target's vocabulary (on a grammar worker: it may take a second);
    400 `invalid_grammar` naming `param` if llguidance refuses it or it allows no output at all.
    `server`: what gives the target's tokenizer (`grammar_tokenizer()`: the request builder's ServerView);
    `what`: what the field holds ("JSON schema"), for the message."""
    try:
        return compile_grammar(grammar, server.grammar_tokenizer(), what, param)
    except GrammarError as e:
        raise grammar_error(e, param) from None
