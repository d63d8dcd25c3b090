"""The cross-request store: earlier requests' text, indexed for suffix matching, bounded in bytes.

One store per engine (per loaded target), shared by its slots. A finished request
adds one document: the last PROMPT_TAIL tokens of its prompt, then its output. The
prompt's tail is what lines a retried or re-sent request up with the answer it got
before; the rest of a prompt is mostly earlier turns of the same conversation, which
the store already holds as their own documents (storing every turn's whole history
again would skew the counts and fill the store with copies).

Index: every window of ORDERS tokens in a document, as a 64-bit hash of the window
(order mixed in) -> the position that follows it. Documents live in immutable
segments of sorted (key, position) arrays; a lookup is a binary search per segment,
newest first. New documents form segments that merge like a binary counter (sizes
double; two sorted runs merge in linear time) up to 1/8 of the store, so there are
at most ~8 full segments plus O(log n) small ones, and no merge or eviction copies
more than 1/8 of the store. Within one key, positions ascend, so the newest
occurrences are the last.

Each document also keeps a key of its request's whole prompt and where its output starts, so that
the same request sent again is told from one that merely ends alike (`Hits.same`).

Memory: 4 bytes a token plus 12 bytes per (window, order), about 52 bytes a token
with the default orders, and 20 bytes a document, counted exactly from the arrays. Past the budget, whole
documents go, oldest first, across scopes (the segments are trimmed in place).

Scopes keep tenants apart: a lookup sees only its own scope's documents.
"""
from __future__ import annotations

import hashlib
import threading
from collections import deque
from typing import NamedTuple, Sequence

import numpy as np

ORDERS = (32, 16, 8, 4)  # window lengths indexed, longest first (a shorter match is weak evidence)
PROMPT_TAIL = 256  # prompt tokens kept in front of each output
_SEGMENT_SHARE = 8  # a segment grows to at most 1/8 of the store: that bounds a merge's or an eviction's copy

_MASK = (1 << 64) - 1
_B = 0x9E3779B97F4A7C15  # odd, so invertible mod 2^64
_B_INV = pow(_B, -1, 1 << 64)
_ORDER_SALT = 0xD6E8FEB86659FD93
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # splitmix64's finaliser


def _mix(z: int) -> int:
    z ^= z >> 30
    z = (z * _M1) & _MASK
    z ^= z >> 27
    z = (z * _M2) & _MASK
    return z ^ (z >> 31)


def _mix_np(z: np.ndarray) -> np.ndarray:
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(_M1)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(_M2)
    return z ^ (z >> np.uint64(31))


_POW = [pow(_B, i, 1 << 64) for i in range(max(ORDERS) + 1)]


def tail_key(seq: Sequence[int], order: int) -> int:
    """The key of the window seq[-order:] (the caller checks len(seq) >= order)."""
    h, n = 0, len(seq)
    for i in range(order):
        h = (h + (seq[n - 1 - i] + 1) * _POW[i]) & _MASK
    return _mix((h + order * _ORDER_SALT) & _MASK)


def tail_keys(seq: Sequence[int], orders: Sequence[int], end: int | None = None) -> list[int]:
    """[len(orders)] keys of the windows ending at `end` (default: the end of seq), one per order.
    One pass over the longest window; an order longer than what precedes `end` gets -1 (matches nothing)."""
    n = len(seq) if end is None else end
    keys, h, i = {}, 0, 0
    for order in sorted(orders):
        if order > n:
            break
        while i < order:
            h = (h + (seq[n - 1 - i] + 1) * _POW[i]) & _MASK
            i += 1
        keys[order] = _mix((h + order * _ORDER_SALT) & _MASK)
    return [keys.get(o, -1) for o in orders]


def window_keys(tokens: np.ndarray, order: int, lo: int, hi: int) -> np.ndarray:
    """[hi - lo] uint64 keys of the windows tokens[e - order:e] for e in [lo, hi), lo >= order.

    The polynomial hash sum_j (t_j + 1) B^(e-1-j) of each window, from one prefix sum of
    (t_j + 1) B^-j (mod 2^64, numpy's uint64 wraps): window = (P[e] - P[e - order]) B^(e-1).
    """
    if hi <= lo:
        return np.empty(0, np.uint64)
    start = lo - order  # tokens before it play no part
    v = tokens[start:hi - 1].astype(np.uint64) + np.uint64(1)  # the last window ends before hi - 1
    n = len(v)
    prefix = np.zeros(n + 1, np.uint64)  # P[i] = sum_{j<i} v_j B^-(j+1)
    np.cumsum(v * np.cumprod(np.full(n, _B_INV, np.uint64)), out=prefix[1:])
    e = np.arange(order, n + 1)  # window ends, relative to start
    powers = np.cumprod(np.full(n, _B, np.uint64))  # powers[i] = B^(i+1)
    h = (prefix[e] - prefix[e - order]) * powers[e - 1]  # sum_j v_j B^(e-1-j)
    return _mix_np(h + np.uint64(order * _ORDER_SALT & _MASK))


def prompt_key(prompt: Sequence[int]) -> int:
    """A 64-bit key of a whole prompt: two requests with the same key asked the same thing."""
    return int.from_bytes(hashlib.blake2b(np.asarray(prompt, np.int32).tobytes(), digest_size=8).digest(), "little")


class _Segment:
    """Whole documents, concatenated, and their windows' keys sorted (positions ascending within a key)."""

    __slots__ = ("tokens", "ends", "prompts", "answers", "keys", "pos")

    def __init__(self, tokens: np.ndarray, ends: np.ndarray, prompts: np.ndarray, answers: np.ndarray,
                 keys: np.ndarray, pos: np.ndarray):
        self.tokens = tokens  # [n] int32
        self.ends = ends  # [n_docs] int64: each document's end offset
        self.prompts = prompts  # [n_docs] uint64: each document's whole prompt's key (prompt_key)
        self.answers = answers  # [n_docs] int32: where each document's output starts, from its start
        self.keys = keys  # [m] uint64, sorted
        self.pos = pos  # [m] int32: the position after each window (its continuation's start)

    @classmethod
    def of(cls, doc: np.ndarray, orders: Sequence[int], prompt: int, answer: int) -> "_Segment":
        keys, pos = [], []
        for order in orders:  # windows with something after them: ends in [order, n)
            if len(doc) > order:
                keys.append(window_keys(doc, order, order, len(doc)))
                pos.append(np.arange(order, len(doc), dtype=np.int32))
        keys_a = np.concatenate(keys) if keys else np.empty(0, np.uint64)
        pos_a = np.concatenate(pos) if pos else np.empty(0, np.int32)
        order_ = np.argsort(keys_a, kind="stable")  # per order, positions were ascending
        return cls(doc, np.array([len(doc)], np.int64), np.array([prompt], np.uint64), np.array([answer], np.int32),
                   keys_a[order_], pos_a[order_])

    @property
    def n_docs(self) -> int:
        return len(self.ends)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.tokens, self.ends, self.prompts, self.answers, self.keys, self.pos))

    def merge(self, newer: "_Segment") -> "_Segment":
        """One segment of self's documents, then newer's. Two sorted runs: a stable sort merges them
        in linear time, older positions first within a key."""
        n = len(self.tokens)
        keys = np.concatenate([self.keys, newer.keys])
        order = np.argsort(keys, kind="stable")
        pos = np.concatenate([self.pos, newer.pos + np.int32(n)])
        return _Segment(np.concatenate([self.tokens, newer.tokens]), np.concatenate([self.ends, newer.ends + n]),
                        np.concatenate([self.prompts, newer.prompts]), np.concatenate([self.answers, newer.answers]),
                        keys[order], pos[order])

    def drop_front(self, n_docs: int) -> "_Segment | None":
        """Without its first n_docs documents (None: nothing left). Filtering keeps the order."""
        if n_docs >= self.n_docs:
            return None
        cut = int(self.ends[n_docs - 1])
        keep = self.pos > cut  # a window's continuation lies in the window's own document
        return _Segment(self.tokens[cut:].copy(), self.ends[n_docs:] - cut, self.prompts[n_docs:].copy(),
                        self.answers[n_docs:].copy(), self.keys[keep], self.pos[keep] - np.int32(cut))

    def same_request(self, p: int, d: int, prompt: int, answer: np.ndarray) -> bool:
        """Whether document d asked the same prompt and answered `answer` before position p."""
        at = (int(self.ends[d - 1]) if d else 0) + int(self.answers[d])
        return (int(self.prompts[d]) == prompt and p - at == len(answer)
                and np.array_equal(self.tokens[at:p], answer))


class SuffixStore:
    """Earlier requests' prompt tails and outputs, shared by an engine's slots; thread-safe.

    max_bytes bounds what the arrays hold; the oldest whole documents are evicted past it.
    """

    def __init__(self, max_bytes: int, prompt_tail: int = PROMPT_TAIL):
        if max_bytes <= 0:
            raise ValueError(f"the cross-request store needs a positive size, got {max_bytes} bytes")
        self.max_bytes = max_bytes
        self.prompt_tail = prompt_tail
        self._lock = threading.Lock()
        self._scopes: dict[str, list[_Segment]] = {}  # scope -> segments, oldest first
        self._docs: deque[tuple[str, int]] = deque()  # (scope, bytes) of every document, oldest first
        self.nbytes = 0
        self.n_tokens = 0

    @property
    def n_docs(self) -> int:
        return len(self._docs)

    def add(self, prompt: Sequence[int], output: Sequence[int], scope: str = "") -> bool:
        """Store a finished request: its prompt's tail and its output. False if it was not stored
        (no output, or larger than the whole store)."""
        if not output:
            return False
        tail = list(prompt[-self.prompt_tail:]) if self.prompt_tail else []
        doc = np.asarray(tail + list(output), dtype=np.int32)
        seg = _Segment.of(doc, ORDERS, prompt_key(prompt), len(tail))  # built outside the lock: lookups go on
        if seg.nbytes > self.max_bytes:
            return False
        with self._lock:
            segs = self._scopes.setdefault(scope, [])
            segs.append(seg)
            self._docs.append((scope, seg.nbytes))
            self.nbytes += seg.nbytes
            self.n_tokens += len(doc)
            # binary-counter merging: O(log n) segments, each token merged O(log n) times
            while (len(segs) >= 2 and len(segs[-2].tokens) <= 2 * len(segs[-1].tokens)
                   and segs[-2].nbytes + segs[-1].nbytes <= self.max_bytes // _SEGMENT_SHARE):
                newer = segs.pop()
                segs[-1] = segs[-1].merge(newer)
            self._evict()
        return True

    def _evict(self) -> None:
        """Drop the oldest documents until the arrays fit max_bytes."""
        drop: dict[str, int] = {}
        while self.nbytes > self.max_bytes and self._docs:
            scope, nbytes = self._docs.popleft()
            drop[scope] = drop.get(scope, 0) + 1
            self.nbytes -= nbytes
        for scope, n in drop.items():
            segs = self._scopes[scope]
            while n:
                first = segs[0]
                take = min(n, first.n_docs)
                self.n_tokens -= int(first.ends[take - 1])
                rest = first.drop_front(take)
                if rest is None:
                    segs.pop(0)
                else:
                    segs[0] = rest
                n -= take
            if not segs:
                del self._scopes[scope]

    def lookup(self, keys: Sequence[int], scope: str = "", limit: int = 16, span: int = 64,
               request: tuple[int, np.ndarray] | None = None) -> "Hits":
        """The continuations of the first key in `keys` (longest window first) that occurs in the scope:
        up to `limit`, newest first, each up to `span` tokens (it ends where its document ends).

        request: (prompt_key of a request's whole prompt, its answer so far [m]): each hit says whether
        it is that request's own earlier answer at the same point (`Hits.same`)."""
        with self._lock:
            segs = self._scopes.get(scope)
            if not segs or not keys:
                return Hits(-1, [], [], [])
            q = np.array([k & _MASK for k in keys], np.uint64)
            found, best, after = [], len(keys), 0
            for seg in reversed(segs):  # newest first
                if seg.keys.size:  # (a request too short to hold a window has none)
                    lo = np.searchsorted(seg.keys, q)
                    hit = np.flatnonzero(seg.keys.take(lo, mode="clip") == q)
                    if hit.size:
                        best = min(best, int(hit[0]))
                        found.append((seg, lo, after))
                after += seg.n_docs  # documents newer than the next segment's
            if best == len(keys):
                return Hits(-1, [], [], [])
            out = Hits(best, [], [], [])
            for seg, lo, after in found:
                a = int(lo[best])
                b = int(np.searchsorted(seg.keys, q[best], "right"))
                if b <= a:
                    continue
                starts = seg.pos[max(a, b - (limit - len(out.continuations))):b][::-1]  # newest first
                docs = np.searchsorted(seg.ends, starts, "right")
                for p, d in zip(starts.tolist(), docs.tolist()):
                    out.continuations.append(seg.tokens[p:min(p + span, int(seg.ends[d]))].tolist())
                    out.same.append(request is not None and seg.same_request(p, d, *request))
                    out.ago.append(after + seg.n_docs - d)
                if len(out.continuations) >= limit:
                    break
            return out


class Hits(NamedTuple):
    """What SuffixStore.lookup found."""

    index: int  # the first of the keys that occurs (-1: none)
    continuations: list[list[int]]  # newest first
    same: list[bool]  # [len(continuations)] whether it is the asking request's own earlier answer (`request`)
    ago: list[int]  # [len(continuations)] the stored request it comes from: 1 the scope's newest, 2 the one before, ...
