"""Output constraints as the core takes them: one llguidance grammar, whatever field gave it.

An adapter reads its API's constraint fields (OpenAI's `response_format`, llama-server's `grammar`
and `json_schema`, the tools of any API) and compiles them here; each failure is a 400 naming the
field it came from (`param`, the adapter's path). A request may carry one constraint: two that would
each constrain the output are refused with both names (`conflict`), rather than one silently winning.
"""
from __future__ import annotations

import anyio

from ....grammar import GrammarError, from_gbnf, from_json_schema, json_object
from ...http.errors import ApiError, bad_request

__all__ = ["check_usable", "conflict", "gbnf_grammar", "grammar_error", "json_object", "schema_grammar"]


def grammar_error(e: GrammarError, param: str) -> ApiError:
    return bad_request(f"{param}: {e}", param, "invalid_grammar")


def schema_grammar(schema: dict, param: str) -> str:
    """The grammar of a JSON Schema; 400 `invalid_grammar` naming `param` if it is not one llguidance takes."""
    try:
        return from_json_schema(schema)
    except GrammarError as e:
        raise grammar_error(e, param) from None


def gbnf_grammar(text: str, param: str) -> str:
    """The grammar of a GBNF text (llama.cpp's); 400 `invalid_grammar` naming `param`."""
    try:
        return from_gbnf(text)
    except GrammarError as e:
        raise grammar_error(e, param) from None


def conflict(first: str, second: str) -> ApiError:
    return bad_request(f"{first} and {second} both constrain the output: give one of them", second,
                       "conflicting_parameters")


async def check_usable(engine, grammar: str, param: str) -> None:
    """400 if the target's tokenizer cannot run the grammar (checked off the event loop: compiling
    a large schema takes milliseconds)."""
    try:
        await anyio.to_thread.run_sync(engine.check_grammar, grammar)
    except GrammarError as e:
        raise grammar_error(e, param) from None
