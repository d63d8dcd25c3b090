"""A reasoning block's rule: its budget, and an output constraint that starts after it.

A reasoning model answers `<think>...</think>` first (or its template's own markers; a template
may open the block itself, so that the answer starts inside it). `ReasoningRule` follows the
committed tokens through the phases of such an answer:

    start  -> the answer may open the block (the open tag, after blanks)
    think  -> inside the block: free, each token counted against the budget
    force  -> the budget is spent: the close tag's tokens are the only ones allowed (forced, so
              drafted for free by drafters.forced), then generation carries on with the answer
    answer -> after the block (or without one): the request's own constraint, if any, from here

It has `grammar.Constraint`'s interface, so the engine treats it as any constraint: each
verified row is masked under the phase its draft prefix reaches, drafters are cut where they
break it, the draft model drafts under it. Rows stop where a draft prefix moves into the
constrained answer (the first row that the inner constraint would judge): the target's token
there is the target alone's, and the next step starts under the inner constraint. So speculation
stays on inside and outside the block, and greedy text equals the target alone's under the same
rule. The inner constraint (a grammar, e.g. the tools'; or none) sees only the answer's tokens, unless
it writes the block itself (its text opens it, `<think>` as text, not as the model's own open token): the
block is then "judged", every token of it the grammar's, and still counted against the budget; when the
budget is spent the close tag is forced there too, and a grammar that does not allow it at that point is
a dead end (`error`), never a block that runs past its budget.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from ..config import ReasoningBlock

START, THINK, FORCE, ANSWER = "start", "think", "force", "answer"
_BLANK = b" \t\r\n"


@dataclass(frozen=True, slots=True)
class _State:
    phase: str
    n: int = 0  # tokens of reasoning so far (think), or close-tag tokens written (force)
    tail: bytes = b""  # start: the answer's bytes so far; think: the last bytes, for a close tag in pieces
    judged: bool = False  # think, force: the inner constraint wrote the open tag and judges the block's tokens


class ReasoningRule:
    """The request's reasoning phases over the committed tokens, around an optional inner constraint."""

    def __init__(self, model, reasoning: ReasoningBlock, inner=None):
        self.inner = inner
        self.budget = reasoning.budget
        self.open, self.close = reasoning.open.encode(), reasoning.close.encode()
        self.open_ids = model.tokenize(reasoning.open, add_special=False, parse_special=True)
        self.close_ids = model.tokenize(reasoning.close, add_special=False, parse_special=True)
        self.n_vocab = model.vocab.n_vocab
        self._opens = self.open_ids[:1] if len(self.open_ids) == 1 else []  # the open tag as one token
        self._bytes = model.token_bytes
        self.state = self._thinking(0) if reasoning.inside else _State(START)
        self.n_committed = 0
        self._error: str | None = None

    # --- the phases ------------------------------------------------------------------------------

    def _thinking(self, n: int, tail: bytes = b"", judged: bool = False) -> _State:
        return _State(FORCE, judged=judged) if 0 <= self.budget <= n else _State(THINK, n, tail, judged)

    def _piece(self, token: int) -> bytes:
        return self._bytes(token) if 0 <= token < self.n_vocab else b""

    def step(self, s: _State, token: int) -> _State:
        """The state after `token`."""
        if s.phase == ANSWER:
            return s
        if s.phase == FORCE:
            n = s.n + 1
            return _State(ANSWER) if n >= len(self.close_ids) else _State(FORCE, n, judged=s.judged)
        if s.phase == THINK:
            if len(self.close_ids) == 1 and token == self.close_ids[0]:
                return _State(ANSWER)
            tail = s.tail + self._piece(token)
            if self.close in tail:  # the close tag written in pieces
                return _State(ANSWER)
            return self._thinking(s.n + 1, tail[-len(self.close):], s.judged)
        # start: the open tag (one token, or its text after blanks) opens the block; anything else is the
        # answer. Under an inner constraint the open token opens a block the constraint does not see (it
        # judges the answer's first token after it); the open tag's text is the constraint's own writing,
        # which opens a judged block
        if token in self._opens:
            return self._thinking(0)
        text = (s.tail + self._piece(token)).lstrip(_BLANK)
        if text.startswith(self.open):
            return self._thinking(0, text[len(self.open):], self.inner is not None)
        if self.open.startswith(text):
            return _State(START, 0, s.tail + self._piece(token))
        return _State(ANSWER)

    def _constrained(self, s: _State) -> bool:
        """Whether the inner constraint judges the token after state `s` (alone or with the open tag)."""
        return self.inner is not None and (s.phase in (START, ANSWER) or s.judged)

    def _judges(self, s: _State, token: int) -> bool:
        """Whether `token` after state `s` is the inner constraint's (the answer's, or a judged block's)."""
        return s.phase == ANSWER or s.judged or s.phase == START and token not in self._opens

    # --- the committed state (grammar.Constraint's interface) ------------------------------------

    @property
    def error(self) -> str | None:
        return self._error or (self.inner.error if self.inner is not None else None)

    @property
    def seconds(self) -> float:
        return self.inner.seconds if self.inner is not None else 0.0

    @property
    def done(self) -> bool:
        return self.state.phase == ANSWER and self.inner is not None and self.inner.done

    def stuck(self) -> bool:
        s = self.state
        if s.phase == FORCE and s.judged and self.inner.valid_prefix([self.close_ids[s.n]]) == 0:
            self._error = (f"the reasoning budget ({self.budget} tokens) is spent, and the output constraint, which "
                           "writes the reasoning block, does not allow its close tag there")
            return True
        return self._constrained(s) and self.inner.stuck()

    def commit(self, tokens: Sequence[int]) -> None:
        answer = []
        for token in tokens:
            before, self.state = self.state, self.step(self.state, token)
            if self.inner is not None and self._judges(before, token):
                answer.append(token)  # the answer's own token (not a tag that closed a block it did not write)
        self.n_committed += len(tokens)
        if answer and self.inner is not None:
            self.inner.commit(answer)

    def forced(self, k: int) -> list[int]:
        s = self.state
        if s.phase == FORCE:
            return self.close_ids[s.n:][:max(k, 0)]
        if s.phase == ANSWER and self.inner is not None:
            return self.inner.forced(k)
        return []

    def valid_prefix(self, tokens: Sequence[int], after: Sequence[int] = ()) -> int:
        if self.state.phase == ANSWER:
            return self.inner.valid_prefix(tokens, after) if self.inner is not None else len(tokens)
        s, n = self.state, 0
        for i, token in enumerate([*after, *tokens]):
            if not self._allows(s, token):
                break
            s, n = self.step(s, token), n + (i >= len(after))
        return n

    def _allows(self, s: _State, token: int) -> bool:
        """Whether `token` may follow state `s` before the answer's constraint judges anything: the
        forced close tag's next token; the open token where the inner constraint would judge the rest."""
        if s.phase == FORCE:
            return token == self.close_ids[s.n]
        return not self._constrained(s) or token in self._opens

    # --- looking ahead ---------------------------------------------------------------------------

    def masked(self, logits: np.ndarray, tokens: Sequence[int]) -> np.ndarray:
        """Rows of `logits` ([R, V], row i after the committed tokens and tokens[:i]) under the phase
        each reaches: free while reasoning, one close-tag token while forcing, the inner constraint's
        (with the open tag) at the answer's start. Rows stop before a later row the inner constraint
        would judge: the step ends there and the next one starts under it."""
        s = self.state
        if s.phase == ANSWER:
            return self.inner.masked(logits, tokens) if self.inner is not None else logits
        rows = min(len(logits), len(tokens) + 1)
        out = logits[:rows]
        copied = False
        for i in range(rows):
            if i and self._constrained(s):
                return out[:i]
            if s.phase == FORCE or self._constrained(s):
                if not copied:
                    out, copied = np.array(out, dtype=np.float32), True
                out[i] = self._row(s, out[i])
            if i < len(tokens):
                s = self.step(s, tokens[i])
        return out

    def _row(self, s: _State, row: np.ndarray) -> np.ndarray:
        """One row under state `s`: the next close-tag token (force), or the inner constraint's row
        with the open tag allowed too (start)."""
        if s.phase == FORCE:
            return _only(row, [self.close_ids[s.n]])
        allowed = np.array(self.inner.masked(row[None], ())[0], dtype=np.float32)
        for token in self._opens if s.phase == START else ():
            if token < len(row):
                allowed[token] = row[token]
        return allowed

    @contextmanager
    def ahead(self) -> Iterator["_Ahead"]:
        """Tentative steps past the committed state, for a drafter: once in the answer, the inner
        constraint's own walk."""
        if self.state.phase == ANSWER and self.inner is not None:
            with self.inner.ahead() as walk:
                yield walk
            return
        yield _Ahead(self)


class _Ahead:
    """A draft model's walk before the answer: free, except the forced close tag. Past the block the
    draft goes unmasked (the verifier's rows stop there: the target judges the answer's first token)."""

    def __init__(self, rule: ReasoningRule):
        self.rule, self.s = rule, rule.state

    def advance(self, token: int) -> bool:
        if self.s.phase == FORCE and token != self.rule.close_ids[self.s.n]:
            return False
        self.s = self.rule.step(self.s, token)
        return True

    def mask(self, logits: np.ndarray) -> np.ndarray | None:
        if self.s.phase != FORCE:
            return logits
        token = self.rule.close_ids[self.s.n]
        row = np.asarray(logits, dtype=np.float32).reshape(-1)
        return _only(row, [token]).reshape(np.shape(logits)) if token < len(row) else None


def _only(row: np.ndarray, ids: Sequence[int]) -> np.ndarray:
    """A copy of one row of logits with everything but `ids` at -inf."""
    out = np.full_like(row, -np.inf)
    ids = [i for i in ids if i < len(row)]
    out[ids] = row[ids]
    return out


def with_reasoning(reasoning: ReasoningBlock | None, inner, model):
    """The request's constraint with its reasoning rule around it, where one is needed: a budget to
    keep, or an inner constraint that must wait for the block to end. Else `inner` as it is."""
    if reasoning is None or reasoning.budget < 0 and inner is None:
        return inner
    return ReasoningRule(model, reasoning, inner)
