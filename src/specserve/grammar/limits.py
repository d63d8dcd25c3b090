"""What a schema or grammar may be: the limits checked before llguidance sees it.

llguidance compiles recursively on the native stack, and some shapes take seconds or crash:
measured on llguidance 1.9.1 (2 cores, a 49k-token vocabulary; docs/structured.md has the table):

- a chain of lexeme rules (`r0 ::= "x0" | r1`, GBNF's terminal-only rules become Lark lexemes)
  takes ~2.4 KB of stack a link: 3,600 links overflow an 8 MiB stack (the process dies, SIGSEGV);
- a chain of `$ref`s through `anyOf` takes ~8 KB a link: 1,060 overflow 8 MiB;
- optional properties of one object cost superlinear time: 1,000 take 0.2 s to compile, 2,500
  1.5 s, 10,000 36 s; 15,000 make llguidance panic (over 65,525 grammar symbols);
- converting GBNF to Lark (llguidance's Python converter) is quadratic in rules: 1,000 rules
  0.4 s, 5,000 17 s;
- JSON nesting past 128 levels is refused by llguidance's JSON reader (serde_json's limit).

So every limit below keeps the deepest recursion a source can reach under 1,000 links (about
8 MiB at the worst measured cost a link), and compiling runs on threads with STACK_BYTES of
stack (grammar.compiled), 32x that. Sizes keep the compile under about 1.5 s on those 2 cores.
OpenAI's structured outputs take at most 5,000 properties in all (MAX_PROPERTIES).
"""
from __future__ import annotations

import re


MAX_GRAMMAR_BYTES = 64 << 10  # GBNF or Lark text
MAX_GRAMMAR_RULES = 1_000  # rule definitions in a GBNF or Lark text: the longest chain of rules
MAX_SCHEMA_DEPTH = 64  # nesting of objects and arrays in a JSON Schema document
MAX_SCHEMA_NODES = 50_000  # objects, arrays and values in a JSON Schema document
MAX_PROPERTIES = 5_000  # properties of all the schema's objects together (OpenAI's limit)
MAX_OBJECT_PROPERTIES = 1_000  # properties of one object
MAX_REFS = 1_000  # `$ref`s in a schema: the longest chain of references
MAX_TOOLS = 128  # tools in a request (OpenAI's limit): 1,000 compile in 1.3 s, 5,000 make llguidance panic
STACK_BYTES = 256 << 20  # each compiling thread's stack (virtual: only what recursion touches is resident)


class GrammarError(ValueError):
    """A schema or grammar that cannot constrain generation; the message names what is wrong."""


# A rule definition at a line's start: GBNF's `name ::=`, Lark's `name:` (also `name.2:` priorities).
# A line may end with \r alone: llguidance's GBNF reader takes that as a new line too.
_GBNF_RULE = re.compile(r"(?:\A|[\r\n])[ \t]*[\w-]+[ \t]*::=")
_LARK_RULE = re.compile(r"(?:\A|[\r\n])[ \t]*[?!]?[A-Za-z_][\w-]*(?:\.-?\d+)?[ \t]*:")


def limit_error(what: str, found: str, limit: int, name: str) -> GrammarError:
    """The refusal for a source past a limit: what, how much, and the limit's name and value."""
    return GrammarError(f"{what} {found}, over the limit of {limit:,} ({name}); a larger one could take the server "
                        f"seconds to compile or overflow its stack")


def check_grammar_text(text: str, what: str, lark: bool) -> None:
    """GrammarError if a GBNF (lark=False) or Lark grammar text is past MAX_GRAMMAR_BYTES or MAX_GRAMMAR_RULES."""
    n_bytes = len(text.encode("utf-8", "surrogatepass"))
    if n_bytes > MAX_GRAMMAR_BYTES:
        raise limit_error(what, f"is {n_bytes:,} bytes", MAX_GRAMMAR_BYTES, "bytes of grammar text")
    rules = len((_LARK_RULE if lark else _GBNF_RULE).findall(text))
    if rules > MAX_GRAMMAR_RULES:
        raise limit_error(what, f"defines {rules:,} rules", MAX_GRAMMAR_RULES, "rules in a grammar")


def check_schema(schema, what: str = "JSON schema") -> None:
    """GrammarError if a JSON Schema document (parsed) is past a limit: depth, nodes, properties, $refs.
    Walked iteratively, so a document too deep for Python's recursion is refused, not a crash."""
    nodes = properties = refs = 0
    stack = [(schema, 1)]
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if nodes > MAX_SCHEMA_NODES:
            raise limit_error(what, f"has more than {MAX_SCHEMA_NODES:,} values", MAX_SCHEMA_NODES,
                              "values in a schema")
        if isinstance(value, dict):
            props = value.get("properties")
            if isinstance(props, dict):
                if len(props) > MAX_OBJECT_PROPERTIES:
                    raise limit_error(what, f"has an object of {len(props):,} properties", MAX_OBJECT_PROPERTIES,
                                      "properties of one object")
                properties += len(props)
                if properties > MAX_PROPERTIES:
                    raise limit_error(what, f"has more than {MAX_PROPERTIES:,} properties", MAX_PROPERTIES,
                                      "properties in a schema")
            if "$ref" in value:
                refs += 1
                if refs > MAX_REFS:
                    raise limit_error(what, f"has more than {MAX_REFS:,} $refs", MAX_REFS, "$refs in a schema")
            children = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth >= MAX_SCHEMA_DEPTH and children:
            raise limit_error(what, f"nests deeper than {MAX_SCHEMA_DEPTH} levels", MAX_SCHEMA_DEPTH,
                              "levels of nesting")
        stack.extend((child, depth + 1) for child in children)
