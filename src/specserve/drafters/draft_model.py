"""A small draft model with its own KV cache, kept in step with the committed sequence.

The cache is synchronised lazily at each proposal: whatever part of it still matches
the committed sequence is kept, the rest is truncated, and the missing tokens (a
bonus or recovered token, the last accepted draft token) are caught up in one batch.
A policy may hand it a stopping rule (drafters.base.StopRule), asked at each token with
the draft's top probability there; `continue_after` drafts after another drafter's tokens
(the hybrid). A cache bounded by --draft-ctx (window.py) holds the sequence's first tokens
and its latest ones, and keeps itself in step the same way: its prompt prefill is at most
its window, what the prompt cost auto is told (`missing`) too.

Each token is drawn with the request's noise for its position (`Sampler.pick`): under
--verify gumbel that makes it the target's own token wherever the two models agree
closely enough. A target with a larger (padded) vocabulary can commit a token the draft
cannot evaluate; the draft then sees a stand-in token there: its drafts get worse, the
text cannot (the target verifies every token).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .. import steps
from ..backends.base import Context, Model, common_prefix, sync_prefix
from ..backends.cache_reuse import plan_reuse
from ..sampling import Sampler
from ..top_k import top_probability
from .base import EMPTY_DRAFT, BaseDrafter, Draft, StopRule
from .window import WindowedContext

__all__ = ["DraftModelDrafter", "GreedyAcceptance", "common_prefix", "sync_prefix"]


class GreedyAcceptance:
    """What a draft model's greedy drafts achieved, over an engine's requests (the pairing check at run time)."""

    def __init__(self) -> None:
        self.drafted = self.accepted = 0

    def add(self, drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted


class DraftModelDrafter(BaseDrafter):
    name = "draft"

    def __init__(self, model: Model, ctx: Context, p_min: float = 0.0, draft_min: int = 0,
                 greedy_acceptance: GreedyAcceptance | None = None, grammar=None, cache_reuse: int = 0):
        self.model = model
        self.cache_reuse = cache_reuse  # --cache-reuse: keep moved runs of this many cached tokens (0: prefix only)
        self.grammar = grammar  # grammar.Constraint: draft under the request's mask; None: unconstrained
        self.ctx = ctx  # owned by the caller: it outlives one request and keeps its prefix
        # --draft-ctx: a bounded cache (window.py) that syncs itself; passes run on its cells
        self._window = ctx if isinstance(ctx, WindowedContext) else None
        self._cells = ctx.inner if self._window is not None else ctx
        self.p_min = p_min
        self.draft_min = draft_min
        self.greedy_acceptance = greedy_acceptance
        self._n_vocab = model.vocab.n_vocab
        self._view: list[int] = []  # the sequence as the draft sees it (stand-ins for tokens beyond its vocabulary)
        self._last: tuple[int, bool] = (0, False)  # (tokens, greedy) of the last proposal
        self._scratch: np.ndarray | None = None  # [n_vocab] float32 for the top probability of a greedy draft

    def _see(self, seq: Sequence[int]) -> list[int]:
        """The sequence with tokens the draft cannot evaluate replaced by token 0; grows with seq."""
        view, n = self._view, self._n_vocab
        if len(seq) < len(view):
            del view[:]
        view.extend(t if t < n else 0 for t in seq[len(view):])
        return view

    def missing(self, prompt: Sequence[int]) -> int:
        view = self._see(prompt)
        if self._window is not None:  # what its window holds of the prompt, no more
            return self._window.missing(view[:-1], 1, self.cache_reuse)
        if self.cache_reuse > 0:  # what the sync will keep: the prefix and the moved runs
            return len(view) - 1 - plan_reuse(self.ctx.tokens, view[:-1], self.cache_reuse)[0]
        return len(view) - 1 - common_prefix(self.ctx.tokens, view[:-1])

    def prefill(self, prompt: Sequence[int]) -> None:
        steps.direct(self.prefill_steps(prompt))

    def prefill_steps(self, prompt: Sequence[int]) -> steps.Steps:
        if self._window is not None:  # room for the prompt's last token, which the first step feeds
            yield from self._window.sync(self._see(prompt)[:-1], 1, self.cache_reuse, logits=False)
        else:
            yield from steps.sync_prefix(self.ctx, self._see(prompt)[:-1], self.cache_reuse)

    def propose(self, seq: Sequence[int], k: int, sampler: Sampler, stop: StopRule | None = None) -> Draft:
        return steps.direct(self.propose_steps(seq, k, sampler, stop))

    def propose_steps(self, seq: Sequence[int], k: int, sampler: Sampler,
                      stop: StopRule | None = None) -> steps.Steps:
        self._last = (0, sampler.greedy)
        draft = yield from self._draft(self._see(seq), k, sampler, stop)
        # --draft-min: too short a draft is not worth a batched pass. Under sampling the
        # length depends on the tokens drawn, so dropping short drafts would bias the kept
        # ones; there it is not applied.
        if sampler.greedy and len(draft) < self.draft_min:
            return EMPTY_DRAFT
        self._last = (len(draft), sampler.greedy)
        return draft

    def continue_after(self, seq: Sequence[int], head: Sequence[int], k: int, sampler: Sampler,
                       stop: StopRule | None = None) -> Draft:
        """Up to k tokens that follow seq + head, head being another drafter's tokens (not committed).

        The cache takes head in its first batch; the next proposal drops what was rejected.
        --draft-min does not apply: head already makes the draft long enough to verify.
        """
        return steps.direct(self.continue_after_steps(seq, head, k, sampler, stop))

    @property
    def masked(self) -> bool:
        """Given the request's grammar, it drafts under its mask (a wrapper need not cut its drafts)."""
        return self.grammar is not None

    def continue_after_steps(self, seq: Sequence[int], head: Sequence[int], k: int, sampler: Sampler,
                             stop: StopRule | None = None) -> steps.Steps:
        """`continue_after` as a generator of forward passes; with no head, `propose_steps`."""
        if not head:
            return (yield from self.propose_steps(seq, k, sampler, stop))
        view, n = self._see(seq), len(self._view)
        view.extend(t if t < self._n_vocab else 0 for t in head)
        try:
            return (yield from self._draft(view, k, sampler, stop, head))
        finally:
            del view[n:]  # the view holds committed tokens only

    def _draft(self, view: list[int], k: int, sampler: Sampler, stop: StopRule | None,
               head: Sequence[int] = ()) -> steps.Steps:
        """Up to k tokens after `view` (the draft's view of the sequence, drafted at its positions;
        its last len(head) tokens not committed), under the grammar's mask when there is one."""
        k = min(k, self.ctx.n_ctx - len(view), self._window.max_room if self._window is not None else k)
        if k <= 0:
            return EMPTY_DRAFT
        if self.grammar is None:
            return (yield from self._draw(view, k, sampler, stop))
        with self.grammar.ahead() as walk:  # each position under the mask its drafted tokens reach
            if not all(walk.advance(x) for x in head):
                return EMPTY_DRAFT
            return (yield from self._draw(view, k, sampler, stop, walk))

    def _draw(self, view: list[int], k: int, sampler: Sampler, stop: StopRule | None,
                    walk=None) -> steps.Steps:
        pos = len(view)
        if self._window is not None:  # room for the drafted tokens it evaluates
            logits = yield from self._window.sync(view, k, self.cache_reuse)
        else:
            logits = yield from steps.sync_and_eval(self.ctx, view, self.cache_reuse)
        tokens: list[int] = []
        dists = []
        confidence: list[float] = []
        eog = self.model.vocab.eog
        rules = sampler.rules
        for i in range(k):
            if rules is not None:  # the request's logit_bias and penalties, over what it has seen and drafted
                logits = rules.apply(logits, rules.window(view) + tokens)
            if walk is not None:
                logits = walk.mask(logits)
                if logits is None:
                    break  # the grammar allows nothing the draft can produce: the target will judge
            picked, q = sampler.pick(logits, pos + i)
            x = int(picked[0])
            if walk is not None and not walk.advance(x):
                break
            # --draft-p-min and the policy's stop: stop where the draft is unsure. Both look at
            # the draft's distribution only, never at the token drawn from it, so a kept token
            # is still an unbiased draw from q and rejection sampling stays exact.
            if self.p_min > 0 or stop is not None:
                p = self._top_prob(logits, x) if sampler.greedy else float(q.top(1)[0])
                if p < self.p_min or stop is not None and stop(i, p):
                    break
                confidence.append(p)
            tokens.append(x)
            dists.append(q)
            if x in eog or i == k - 1:
                break
            logits = (yield steps.Eval(self._cells, [x], "last"))[0]
        return Draft(tokens=tokens, dists=None if sampler.greedy else dists, confidence=confidence or None)

    def _top_prob(self, logits: np.ndarray, x: int) -> float:
        """A greedy draft's top probability (of token x, its argmax): of its raw softmax, where sampling's
        is of its processed distribution."""
        row = logits.reshape(-1)  # [1, V] or [V]
        if self._scratch is None or self._scratch.shape != row.shape:
            self._scratch = np.empty(row.shape, np.float32)
        return top_probability(row, x, self._scratch)

    def accepted(self, n: int) -> None:
        # the cache is re-synchronised against the committed sequence on the next proposal
        drafted, greedy = self._last
        if greedy and drafted and self.greedy_acceptance is not None:
            self.greedy_acceptance.add(drafted, n)
