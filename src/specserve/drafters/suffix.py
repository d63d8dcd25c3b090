"""Suffix drafting: the most probable continuation of the longest match, in this request and earlier ones.

The current request's prompt and output are indexed like prompt lookup's (every window
of ORDERS tokens -> the positions after it); earlier requests come from the engine's
shared SuffixStore, indexed the same way. Each step:

1. match: the longest order whose window at the end of the sequence occurred before,
   here or in the store. Windows shorter than 4 tokens are left to prompt lookup: as
   evidence for a long continuation they are weak (on hot prose they drafted at 7-18%
   acceptance; on code edits they lowered acceptance from 60% to 35%). Its occurrences (up to
   `limit`, newest first) are the candidates: a suffix tree's node at that depth, with their counts.
2. walk: from there, take the token most of the agreeing candidates continue with
   (ties: the newest), keep those that agree, repeat. A token's confidence is the
   share of the candidates still in play that continue with it; the walk stops where
   the product of confidences falls below p_min, where the candidates run out, or at
   twice the matched order (a longer match, a longer draft), and never past `cap`.

The same request again (a retry, a regenerate) is told apart: where the store holds an earlier
request with this one's whole prompt (SuffixStore keeps a key of it) that had answered as this one
has so far, only those earlier answers are walked, and the match is reported as SAME_REQUEST + the
answer's length, not as the 32-token window it was found by: auto drafts such a continuation whole,
whatever windows and openings of other text have taught it (docs/cross-request.md). A request that
merely ends alike (the same file after another instruction) is not the same request.
Each draft says where it came from (`Draft.note`): how many different continuations there were,
the share that agreed with the drafted one, and the request it was copied from.

The proposal depends only on the sequence and the store's contents: lossless as any
deterministic draft (the verifier treats it as q = one-hot) and reproducible. The store, scopes,
privacy and why the cap is 64: docs/cross-request.md.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..sampling import Sampler
from .base import EMPTY_DRAFT, BaseDrafter, Draft, Offer
from .suffix_store import ORDERS, SuffixStore, prompt_key, tail_keys, window_keys

DEFAULT_CAP = 64  # see the verify cost curve in the README: 64 tokens cost ~12 plain passes on a CPU
# a match reported at least this much longer than the answer so far is the same request again (no
# window is: they are at most 32 tokens)
SAME_REQUEST = 64
_PY_WINDOWS = 8  # new window ends up to which keys are hashed in Python (numpy's per-call overhead is larger)


class SuffixDrafter(BaseDrafter):
    name = "suffix"

    def __init__(self, store: SuffixStore | None = None, scope: str = "", cap: int = DEFAULT_CAP,
                 p_min: float = 0.1, limit: int = 16):
        if cap < 0 or not 0 <= p_min < 1 or limit < 1:
            raise ValueError(f"need cap >= 0, 0 <= p_min < 1, limit >= 1; got {cap}, {p_min}, {limit}")
        self.store, self.scope = store, scope
        self.cap, self.p_min, self.limit = cap, p_min, limit
        self.reset()

    def reset(self) -> None:
        self._seq: list[int] = []  # the sequence the index describes
        self._src: Sequence[int] | None = None  # the caller's list it was copied from
        self._index: dict[int, list[int]] = {}  # window key -> positions after it, ascending
        self._indexed_to = 0  # windows ending before this are in the index
        self._query: dict[int, int] = {}  # order -> key of the window at the end of _seq
        self._n_prompt = -1  # the length of the first sequence seen: the request's prompt
        self._key: int | None = None  # its prompt's key (suffix_store.prompt_key), once a lookup needs it
        self._arr = np.empty(0, np.int32)  # _seq's tokens as an array (capacity doubles; the tail unused)
        self._at = -1  # len(_seq) when the walk below was made
        self._walk: tuple[int, list[int], list[float]] = (0, [], [])  # (order matched, tokens, confidence)
        self._note: dict | None = None  # where the walk's continuation came from (Draft.note)

    def _sync(self, seq: Sequence[int]) -> None:
        n_old = len(self._seq)
        extends = len(seq) >= n_old and (n_old == 0 or seq[n_old - 1] == self._seq[-1]) and (
            seq is self._src or list(seq[:n_old]) == self._seq)
        if not extends:
            self.reset()
            n_old = 0
        self._src = seq
        self._seq.extend(seq[n_old:])
        n = len(self._seq)
        if n > len(self._arr):
            self._arr = np.concatenate([self._arr[:n_old], np.empty(max(n, 2 * len(self._arr)) - n_old, np.int32)])
        self._arr[n_old:n] = self._seq[n_old:]
        if self._n_prompt < 0:
            self._n_prompt = n

    def _index_to_end(self) -> None:
        """Index the windows ending before the end; keep the keys of those ending at it as the query."""
        n, lo = len(self._seq), self._indexed_to
        if n - lo <= _PY_WINDOWS:  # a step: the last query's keys, then a few new ones
            for e in range(lo, n + 1):
                keys = self._query if e == lo else {
                    o: k for o, k in zip(ORDERS, tail_keys(self._seq, ORDERS, e)) if k != -1}
                if e == n:
                    self._query = keys
                    break
                for key in keys.values():
                    self._index.setdefault(key, []).append(e)
        else:  # a prompt, or a long accepted draft: vectorised
            base = max(0, lo - ORDERS[0])
            arr = np.asarray(self._seq[base:], dtype=np.int64)
            self._query = {}
            for order in ORDERS:
                first = max(lo, order)
                if first > n:
                    continue
                keys = window_keys(arr, order, first - base, n + 1 - base).tolist()  # windows ending at first..n
                for e, key in zip(range(first, n), keys):
                    self._index.setdefault(key, []).append(e)
                self._query[order] = keys[-1]
        self._indexed_to = n

    def _candidates(self) -> tuple[int, list[list[int]], list[int]]:
        """(order, continuations newest first, where each comes from: 0 this request, n the scope's
        n-th newest stored one) of the longest window at the end that occurred before. Where some of
        them are this request's own earlier answers (the same prompt, the same answer so far), those
        alone, and the order is SAME_REQUEST + the answer's length."""
        live = next((o for o in ORDERS if o in self._query and self._query[o] in self._index), 0)
        hits = None
        if self.store is not None:
            asked = [o for o in ORDERS if o >= live and o in self._query]
            if self._key is None:
                self._key = prompt_key(self._arr[:self._n_prompt])
            hits = self.store.lookup([self._query[o] for o in asked], self.scope, self.limit, self.cap,
                                     (self._key, self._arr[self._n_prompt:len(self._seq)]))
        store_order = asked[hits.index] if hits and hits.index >= 0 else 0
        order = max(live, store_order)
        conts: list[list[int]] = []
        ago: list[int] = []
        same: list[bool] = []
        if order and order == live:  # this request is the newest text there is
            starts = self._index[self._query[order]][-self.limit:]
            conts = [self._seq[p:p + self.cap] for p in reversed(starts)]
            ago, same = [0] * len(conts), [False] * len(conts)  # (never the same request: its own prompt)
        if order and order == store_order:
            room = self.limit - len(conts)
            conts, ago, same = conts + hits.continuations[:room], ago + hits.ago[:room], same + hits.same[:room]
        if any(same):  # the same request again: its earlier answers only
            keep = [i for i, x in enumerate(same) if x]
            conts, ago = [conts[i] for i in keep], [ago[i] for i in keep]
            order = len(self._seq) - self._n_prompt + SAME_REQUEST
        return order, conts, ago

    def _walk_from(self, order: int, conts: list[list[int]]) -> tuple[list[int], list[float]]:
        """The most frequent path through the candidates' continuations, with each token's share."""
        groups: dict[tuple, list[int]] = {}  # continuation -> [count, rank of its newest occurrence]
        for rank, c in enumerate(conts):
            g = groups.setdefault(tuple(c), [0, rank])
            g[0] += 1
        active = [(c, n, rank) for c, (n, rank) in groups.items() if c]
        tokens: list[int] = []
        confidence: list[float] = []
        limit, path = min(self.cap, 2 * order), 1.0
        while active and len(tokens) < limit:
            t = len(tokens)
            if len(active) == 1:  # one path left: it is followed as far as it goes, at confidence 1
                rest = list(active[0][0][t:limit])
                tokens += rest
                confidence += [1.0] * len(rest)
                break
            tally: dict[int, list[int]] = {}  # token -> [count, rank of its newest occurrence]
            for c, n, rank in active:
                s = tally.setdefault(c[t], [0, rank])
                s[0] += n
                s[1] = min(s[1], rank)
            token, (count, _) = max(tally.items(), key=lambda kv: (kv[1][0], -kv[1][1]))
            share = count / sum(n for _, n, _ in active)
            path *= share
            if path < self.p_min:
                break
            tokens.append(token)
            confidence.append(share)
            active = [a for a in active if a[0][t] == token and len(a[0]) > t + 1]
        return tokens, confidence

    @staticmethod
    def _origin(order: int, conts: list[list[int]], ago: list[int], tokens: list[int]) -> dict | None:
        """Where the drafted path came from (Draft.note): how many different continuations the
        candidates held, the share of them that agree with the path, the newest agreeing one's request
        (0: this one; n: the scope's n-th newest stored request), and whether they were the same
        request's earlier answers."""
        held = [(c, a) for c, a in zip(conts, ago) if c]
        agree = [a for c, a in held if c[:len(tokens)] == tokens[:len(c)]]
        if not tokens or not agree:
            return None
        return {"continuations": len({tuple(c) for c, _ in held}), "share": round(len(agree) / len(held), 3),
                "requests_ago": agree[0], "same_request": order >= SAME_REQUEST}

    def _lookup(self, seq: Sequence[int]) -> tuple[int, list[int], list[float]]:
        self._sync(seq)
        if self._at != len(self._seq):
            self._index_to_end()
            order, conts, ago = self._candidates()
            self._walk, self._note = (0, [], []), None
            if order:
                tokens, confidence = self._walk_from(order, conts)
                self._walk, self._note = (order, tokens, confidence), self._origin(order, conts, ago, tokens)
            self._at = len(self._seq)
        return self._walk

    def peek(self, seq: Sequence[int]) -> Offer:
        return Offer(*self.match(seq))

    def match(self, seq: Sequence[int]) -> tuple[int, int]:
        """(order, available): what the proposal follows (0: no match), and how many tokens it holds.
        The order is the longest window that matched (the match is at least that long, shorter than
        the next indexed order), or, for the same request again (the store holds this prompt, answered
        as this request has so far), the answer's length + SAME_REQUEST, which no window reaches.
        Cached per sequence length: calling it, then propose, costs one lookup."""
        order, tokens, _ = self._lookup(seq)
        return order, len(tokens)

    def propose(self, seq: Sequence[int], k: int, sampler: Sampler | None = None) -> Draft:
        if k <= 0:
            return EMPTY_DRAFT
        _, tokens, confidence = self._lookup(seq)
        return Draft(tokens=tokens[:k], confidence=confidence[:k], note=self._note) if tokens else EMPTY_DRAFT
