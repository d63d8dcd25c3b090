"""The drafters `--spec auto` knows by name."""
from ..drafters import LOOKUPS
from ..drafters.forced import FORCED

MODEL = "draft"  # the draft model's drafter name
HYBRID = "hybrid"  # a lookup's match, then the draft model (drafters.hybrid)
HYBRID_LOOKUPS = LOOKUPS  # the lookups the hybrid follows, in the order it tries them
# drafters with no model, which copy what follows an earlier occurrence of the text's end:
# nearly free to query or to catch up, and their offer (match length, tokens available) is known
FREE = frozenset(LOOKUPS) | {FORCED}  # and the grammar's forced tokens (drafters.forced), under a grammar
