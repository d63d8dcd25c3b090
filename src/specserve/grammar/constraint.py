"""One request's grammar state: llguidance's matcher over the committed tokens, and the masks.

The matcher advances only on committed tokens (`commit`). Whatever looks ahead (the masks
of a draft's positions, the draft model drafting under the mask) consumes tokens tentatively
and rolls them back (`ahead`). Masks are llguidance's numpy bitmasks (one bit per token of
the target's vocabulary); `masked` turns the rows of a logits array into the constrained ones
(forbidden = -inf) on a copy. Every call into llguidance is timed into `seconds`.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator, Sequence

import numpy as np

import llguidance
import llguidance.numpy as llg_np

from .compiled import CompiledGrammar
from .healing import TokenHealing, vocab_of
from .reasoning import ReasoningRule, with_reasoning
from .sources import GrammarError

_ROWS = 65  # mask rows kept ready: a draft of up to 64 tokens and the bonus row


class Constraint:
    def __init__(self, tokenizer: llguidance.LLTokenizer, grammar: str):
        """grammar: a CompiledGrammar (compiled.py) is copied, any other text compiled here."""
        t = time.perf_counter()
        if isinstance(grammar, CompiledGrammar):
            self.matcher = grammar.matcher()
        else:
            self.matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        self.n_vocab = tokenizer.vocab_size
        self._bits = llg_np.allocate_token_bitmask(_ROWS, self.n_vocab)
        self._row0_at = -1  # the committed length whose row-0 mask _bits[0] holds; -1: none
        self.n_committed = 0
        self._forced: tuple[int, list[int]] = (-1, [])  # (committed length, its fast-forward tokens)
        self.error: str | None = _first_line(self.matcher.get_error()) if self.matcher.is_error() else None
        self.seconds = time.perf_counter() - t

    # --- the committed state -----------------------------------------------------------------

    @property
    def done(self) -> bool:
        """The grammar is complete and allows nothing more (an end-of-generation token at most)."""
        return self.matcher.is_stopped() and self.matcher.is_accepting()

    def stuck(self) -> bool:
        """Whether no token can follow the committed ones (sets `error` to say why)."""
        if self.error is None:
            t = time.perf_counter()
            if self.matcher.is_error():
                self.error = f"grammar error: {_first_line(self.matcher.get_error())}"
            elif self.matcher.is_stopped() and not self.matcher.is_accepting():
                self.error = "the grammar allows no token here and is not complete (dead end)"
            elif not self._row0().any():
                self.error = "the grammar allows no token here (dead end)"
            self.seconds += time.perf_counter() - t
        return self.error is not None

    def commit(self, tokens: Sequence[int]) -> None:
        """Advance over committed tokens (each was allowed by its mask)."""
        if not tokens or self.error is not None:
            return
        t = time.perf_counter()
        if not self.matcher.consume_tokens(list(tokens)):
            self.error = f"grammar error: {_first_line(self.matcher.get_error())}"
        self.n_committed += len(tokens)
        self.seconds += time.perf_counter() - t

    def forced(self, k: int) -> list[int]:
        """Up to k tokens the grammar forces next (llguidance's fast-forward tokens)."""
        if k <= 0 or self.error is not None:
            return []
        if self._forced[0] != self.n_committed:  # once per committed state: peek, shadow and propose ask
            t = time.perf_counter()
            self._forced = (self.n_committed, self.matcher.compute_ff_tokens())
            self.seconds += time.perf_counter() - t
        return self._forced[1][:k]

    def valid_prefix(self, tokens: Sequence[int], after: Sequence[int] = ()) -> int:
        """How many of `tokens` the grammar allows in a row after the committed ones and `after`."""
        if not tokens:
            return 0
        t = time.perf_counter()
        try:
            with self.ahead() as walk:
                if not all(walk.advance(x) for x in after):
                    return 0
                n = next((i for i, x in enumerate(tokens) if not 0 <= x < self.n_vocab), len(tokens))
                return self.matcher.validate_tokens(list(tokens[:n])) if n else 0
        finally:
            self.seconds += time.perf_counter() - t

    # --- looking ahead -------------------------------------------------------------------------

    def masked(self, logits: np.ndarray, tokens: Sequence[int]) -> np.ndarray:
        """The rows of `logits` ([R, V], row i after the committed tokens and tokens[:i]) with what
        the grammar forbids at -inf, as a copy. Rows stop after the first token the grammar forbids
        there (that token is a rejection; nothing after it is judged)."""
        t = time.perf_counter()
        rows = min(len(logits), len(tokens) + 1, _ROWS)
        with self.ahead() as walk:
            self._row0()
            for i in range(1, rows):
                if not walk.advance(tokens[i - 1]):
                    rows = i
                    break
                llg_np.fill_next_token_bitmask(self.matcher, self._bits, i)
        out = apply(logits[:rows], self._bits[:rows])
        self.seconds += time.perf_counter() - t
        return out

    @contextmanager
    def ahead(self) -> Iterator["Ahead"]:
        """Tokens consumed through the yielded Ahead are rolled back on exit."""
        walk = Ahead(self)
        try:
            yield walk
        finally:
            if walk.n:
                self.matcher.rollback(walk.n)

    def _row0(self) -> np.ndarray:
        """The mask after the committed tokens, computed once per committed state."""
        if self._row0_at != self.n_committed:
            llg_np.fill_next_token_bitmask(self.matcher, self._bits, 0)
            self._row0_at = self.n_committed
        return self._bits[0]


class Ahead:
    """Tentative steps past the committed state (Constraint.ahead): masks for a drafter."""

    def __init__(self, constraint: Constraint):
        self.c, self.n = constraint, 0
        self._bits = llg_np.allocate_token_bitmask(1, constraint.n_vocab)

    def advance(self, token: int) -> bool:
        """Consume `token` tentatively; False (and nothing consumed) if the grammar forbids it."""
        if not 0 <= token < self.c.n_vocab or self.c.matcher.try_consume_tokens([token]) != 1:
            return False
        self.n += 1
        return True

    def mask(self, logits: np.ndarray) -> np.ndarray | None:
        """One row of logits ([V] or [1, V]) constrained by the state reached so far, as a copy;
        None where the grammar allows none of its tokens."""
        t = time.perf_counter()
        if self.n == 0:
            bits = self.c._row0()[None]
        else:
            llg_np.fill_next_token_bitmask(self.c.matcher, self._bits, 0)
            bits = self._bits
        out = apply(np.atleast_2d(logits), bits)
        self.c.seconds += time.perf_counter() - t
        return out.reshape(logits.shape) if np.isfinite(out).any() else None


def for_request(params, tokenizer, model) -> "Constraint | TokenHealing | ReasoningRule | None":
    """A request's constraint (params: its SamplingParams): its grammar's matcher (tokenizer(): the
    target's llguidance tokenizer; a CompiledGrammar's matcher is copied, not compiled again), else its
    token healing over the model's vocabulary, else None; inside its reasoning rule where it has one
    (grammar.reasoning: a budget, a grammar after the block)."""
    inner = None
    if params.grammar is not None:
        inner = Constraint(tokenizer(), params.grammar)
        if inner.error:
            raise GrammarError(f"invalid grammar: {inner.error}")
    elif params.heal:
        inner = TokenHealing(vocab_of(model), params.heal)
    return with_reasoning(params.reasoning, inner, model)


def _first_line(message: str) -> str:
    """llguidance's error without the parser state it appends."""
    return (message or "unknown error").strip().splitlines()[0]


def allowed(bits: np.ndarray, n: int) -> np.ndarray:
    """[R, n] bool from llguidance bitmask rows [R, ceil(n / 32)] int32 (bit j of word w: token 32 w + j)."""
    return np.unpackbits(np.ascontiguousarray(bits).view(np.uint8), axis=1, bitorder="little")[:, :n].astype(bool)


def apply(logits: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """A copy of logits [R, V] with the tokens the bitmask rows forbid at -inf (tokens past the
    mask's vocabulary too: a padded vocabulary's extra rows are never text)."""
    R, V = logits.shape
    n = min(V, bits.shape[1] * 32)
    out = np.full((R, V), -np.inf, np.float32)
    ok = allowed(bits, n)
    np.copyto(out[:, :n], logits[:, :n], where=ok)
    return out
