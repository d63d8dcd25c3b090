"""Grammar-constrained generation through llguidance: where constraints come from (sources),
the per-request matcher and its masks (constraint), and the drafter of forced tokens
(drafters.forced). See docs/structured.md."""
from .constraint import Constraint
from .sources import GrammarError, check, from_gbnf, from_grammar_text, from_json_schema, from_lark, json_object

__all__ = ["Constraint", "GrammarError", "check", "from_gbnf", "from_grammar_text", "from_json_schema", "from_lark", "json_object"]
