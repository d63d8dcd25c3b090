"""What kind of work a request is, as `--spec auto` keys what it learns (issue 60).

A pooled acceptance rate learnt on one kind of work is a poor prior for another: the README's main
job (a short prompt, a fresh code answer) keeps 0.95 of the 0.5B's tokens, and a new user's profile
made from it had a code edit take its 207-token prompt into the draft model and draft 7-8 tokens a
step where the edits' lookups copy for free (0.96x the empty profile in the replay). So the engine's
acceptance state (priors.Priors: pooled rates, their spread, their shape; history.History: the
lookups' share) is keyed by the request's kind, known before its first step:

- its temperature regime (0.25 steps: greedy, low, hot);
- its prompt's length, by bucket: under 128 tokens, 512, 2048, more;
- whether the prompt repeats itself (edit-like: code, a document to revise): the share of its
  3-grams seen earlier in it, at least EDIT_LIKE;
- whether a grammar constrains it.

A kind is a str, "REGIME/L<bucket>E<0|1>G<0|1>". A request whose prompt is not known (a caller that
does not pass it, the tests' simulator) and an older profile's entries have the regime alone, a float:
the kind of the code before kinds. How kinds pool is priors.py's.
"""
from __future__ import annotations

from typing import Sequence

LENGTHS = (128, 512, 2048)  # prompt-length bucket edges (tokens)
EDIT_LIKE = 0.1  # share of a prompt's 3-grams seen earlier in it from which it is edit-like (SmolLM2's tokens:
# a chat asking to rename a function in a 4,000-character Python file 0.16; a summary of 3,000 characters of
# prose 0.05; short questions and story prompts 0.02-0.03)
_SCAN = 2048  # the prompt's last tokens the overlap is counted over (a 32k prompt costs no more)


def self_overlap(prompt: Sequence[int]) -> float:
    """The share of the prompt's 3-grams (its last _SCAN tokens) that occurred earlier in it."""
    p = list(prompt[-_SCAN:])
    if len(p) < 8:
        return 0.0
    seen, again = set(), 0
    for g in zip(p, p[1:], p[2:]):
        if g in seen:
            again += 1
        else:
            seen.add(g)
    return again / (len(p) - 2)


def kind_of(regime: float, prompt: Sequence[int] | None, grammar: bool = False) -> float | str:
    """The kind of a request at `regime` with this prompt (None: not known, the regime alone)."""
    if prompt is None:
        return regime
    n = len(prompt)
    length = sum(n >= edge for edge in LENGTHS)
    return f"{regime:g}/L{length}E{int(self_overlap(prompt) >= EDIT_LIKE)}G{int(grammar)}"


def kind_key(saved) -> float | str:
    """A kind as a saved profile holds it: a str, or a number (a regime alone: older profiles)."""
    return saved if isinstance(saved, str) else float(saved)


def regime_of(kind: float | str) -> float:
    """The temperature regime of a kind."""
    return kind if not isinstance(kind, str) else float(kind.split("/", 1)[0])
