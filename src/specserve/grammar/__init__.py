"""Grammar-constrained generation through llguidance: where constraints come from (sources),
what they may be (limits), compiled once off the event loop (compiled), the per-request matcher
and its masks (constraint), and the drafter of forced tokens (drafters.forced); and token healing, a
constraint of the same shape (healing); a reasoning block's budget, around any of them (reasoning).
See docs/structured.md."""
from .compiled import CompiledGrammar, GrammarWorker, compile_grammar
from .constraint import Constraint, for_request
from .healing import TokenHealing
from .reasoning import ReasoningRule
from .sources import GrammarError, check, from_gbnf, from_grammar_text, from_json_schema, from_lark, json_object

__all__ = ["CompiledGrammar", "GrammarWorker", "compile_grammar", "Constraint", "for_request", "TokenHealing",
           "ReasoningRule", "GrammarError", "check", "from_gbnf", "from_grammar_text", "from_json_schema", "from_lark",
           "json_object"]
