"""Token healing: the answer must begin with the text of the prompt's backed-off last token.

An editor's `/infill` prompt ends where the cursor is, often inside a word: `    fr` is the
tokens `    ` and `fr`, and a model that sees them never saw `from` cut there in training. It
answers badly (nothing at all, or ` collections` after `from` with a second space). Healing
drops the last token from the prompt and makes the answer start with its bytes: the model may
write `from` (or `f`, `r`, ...) as it would have, and the caller hides the healed bytes.

`TokenHealing` is a constraint with `grammar.Constraint`'s interface, so the verifier masks
each draft position, drafters are cut where they break it, and the draft model drafts under
it. It constrains only until the healed bytes are written; after that it allows everything
and costs nothing. Allowed while `left` bytes remain: a token whose bytes start with `left`,
or a non-empty token that `left` starts with. Both come from the vocabulary sorted by bytes
(bisect), built once per model.
"""
from __future__ import annotations

import bisect
import threading
import time
import weakref
from contextlib import contextmanager
from typing import Iterator, Sequence

import numpy as np

_tables: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> _Vocab
_building = threading.Lock()


class _Vocab:
    """A vocabulary's token bytes, and the same sorted for prefix ranges."""

    def __init__(self, pieces: list[bytes]):
        self.pieces = pieces
        order = sorted(range(len(pieces)), key=pieces.__getitem__)
        self.sorted_pieces = [pieces[i] for i in order]
        self.sorted_ids = np.asarray(order, dtype=np.int64)
        self.by_piece: dict[bytes, list[int]] = {}
        for i, piece in enumerate(pieces):
            if piece:
                self.by_piece.setdefault(piece, []).append(i)

    def allowed(self, left: bytes) -> np.ndarray:
        """Ids of the tokens allowed while `left` (non-empty) remains to be written."""
        lo = bisect.bisect_left(self.sorted_pieces, left)
        top = left.rstrip(b"\xff")  # the least bytes above every one that starts with `left`
        hi = (bisect.bisect_left(self.sorted_pieces, top[:-1] + bytes([top[-1] + 1]), lo) if top
              else len(self.sorted_pieces))
        shorter = [i for j in range(1, len(left)) for i in self.by_piece.get(left[:j], ())]
        return np.concatenate([self.sorted_ids[lo:hi], np.asarray(shorter, dtype=np.int64)])


def vocab_of(model) -> _Vocab:
    """The model's token bytes (backends' Model: `token_bytes`, `vocab.n_vocab`), read once per model."""
    with _building:  # the server reads it beside the first requests (server/app.py warm): once
        try:
            return _tables[model]
        except (KeyError, TypeError):
            pass
        table = _Vocab([model.token_bytes(i) for i in range(model.vocab.n_vocab)])
        try:
            _tables[model] = table
        except TypeError:
            pass
        return table


def after(left: bytes, piece: bytes) -> bytes | None:
    """What remains to be written after `piece`; None where `piece` breaks the healed text."""
    if not left:
        return b""
    if piece.startswith(left):
        return b""
    if piece and left.startswith(piece):
        return left[len(piece):]
    return None


class TokenHealing:
    """The request's healing state over the committed tokens (grammar.Constraint's interface)."""

    error: str | None = None
    done = False  # never complete: after the healed text the answer is free

    def __init__(self, vocab: _Vocab, heal: bytes):
        self.vocab, self.left, self.n_committed, self.seconds = vocab, heal, 0, 0.0
        self._masks: dict[bytes, np.ndarray] = {}

    def _piece(self, token: int) -> bytes | None:
        return self.vocab.pieces[token] if 0 <= token < len(self.vocab.pieces) else None

    def _step(self, left: bytes, token: int) -> bytes | None:
        piece = self._piece(token)
        return after(left, piece) if piece is not None else (b"" if not left else None)

    def stuck(self) -> bool:
        return False  # the backed-off token itself is always allowed

    def commit(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            self.left = self._step(self.left, token) or b""
        self.n_committed += len(tokens)

    def forced(self, k: int) -> list[int]:
        return []

    def valid_prefix(self, tokens: Sequence[int], after: Sequence[int] = ()) -> int:
        left = self.left
        for token in after:
            left = self._step(left, token)
            if left is None:
                return 0
        for n, token in enumerate(tokens):
            if not left:
                return len(tokens)
            left = self._step(left, token)
            if left is None:
                return n
        return len(tokens)

    def masked(self, logits: np.ndarray, tokens: Sequence[int]) -> np.ndarray:
        """Rows of `logits` ([R, V], row i after the committed tokens and tokens[:i]), constrained,
        as a copy; rows stop after the first token that breaks the healed text. Once healed, the
        logits themselves: the rest of the answer pays nothing."""
        if not self.left:
            return logits
        rows = min(len(logits), len(tokens) + 1)
        out = np.array(logits[:rows], dtype=np.float32)
        left = self.left
        for i in range(rows):
            if not left:
                return out[:rows]
            out[i] = self._mask(out[i], left)
            if i + 1 < rows:
                left = self._step(left, tokens[i])
                if left is None:
                    return out[: i + 1]
        return out

    def _mask(self, row: np.ndarray, left: bytes) -> np.ndarray:
        t = time.perf_counter()
        ids = self._masks.get(left)
        if ids is None:
            ids = self._masks[left] = self.vocab.allowed(left)
        ids = ids[ids < len(row)]
        out = np.full_like(row, -np.inf)
        out[ids] = row[ids]
        self.seconds += time.perf_counter() - t
        return out

    @contextmanager
    def ahead(self) -> Iterator["_Ahead"]:
        yield _Ahead(self)


class _Ahead:
    """Tentative steps past the committed state (TokenHealing.ahead): masks for a drafter."""

    def __init__(self, healing: TokenHealing):
        self.h, self.left = healing, healing.left

    def advance(self, token: int) -> bool:
        left = self.h._step(self.left, token)
        if left is None:
            return False
        self.left = left
        return True

    def mask(self, logits: np.ndarray) -> np.ndarray | None:
        if not self.left:
            return logits
        row = self.h._mask(np.asarray(logits, dtype=np.float32).reshape(-1), self.left)
        return row.reshape(np.shape(logits)) if np.isfinite(row).any() else None
