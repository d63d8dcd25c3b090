"""Step 4 of the loop (slot.py): what a verdict commits, and the logprobs of what it committed.

A verdict's tokens are cut at an end-of-generation token, at max_tokens or at the end of a stop
string, whichever comes first; only the tokens that remain are committed, and only they get logprobs
(logprobs.py), read from the verification pass's rows: token j of a verdict was judged at row j.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from . import logprobs
from .drafters import Drafter
from .grammar import Constraint, TokenHealing
from .logprobs import TokenLogprob
from .policy import Policy
from .sampling import Sampler
from .text import StreamDecoder
from .verifier import Verdict


@dataclass
class Request:
    """What one request's steps share: how it samples, decodes and drafts, and the last step's timings."""

    sampler: Sampler
    decoder: StreamDecoder
    eog: frozenset[int]
    drafters: dict[str, Drafter]
    policy: Policy
    constraint: Constraint | TokenHealing | None = None  # the grammar's (or healing's) state over the committed tokens
    t_draft: float = 0.0
    t_verify: float = 0.0
    shadow: dict[str, list[int]] = field(default_factory=dict)  # what this step's matching lookups would propose
    forced: int = 0  # this step's draft's leading forced tokens (drafters.forced), for the policy
    # this step's verification rows, raw, while raw logprobs are asked for: a view of the backend's
    # output, valid only until the next pass (`take_logprobs` drops it)
    rows: np.ndarray | None = None

    @property
    def raw_logprobs(self) -> bool:
        params = self.sampler.params
        return params.logprobs is not None and params.logprobs_mode == "raw"

    def take_logprobs(self, tokens: Sequence[int], verdict: Verdict) -> list[TokenLogprob] | None:
        """The committed tokens' logprobs (None when the request asks for none)."""
        rows, self.rows = self.rows, None
        n_top = self.sampler.params.logprobs
        if n_top is None:
            return None
        if rows is not None:
            return logprobs.raw(rows, tokens, n_top)
        return logprobs.processed(verdict.target, tokens, n_top)


def commit(req: Request, seq: list[int], verdict: Verdict, n_left: int,
           n_ctx: int) -> tuple[list[int], str, str | None]:
    """Append the verdict's tokens to seq up to an end-of-generation token, max_tokens (n_left more) or the
    end of a stop string, whichever comes first; return them, the text that became final, and why
    generation ends (None: it goes on)."""
    new, finish = verdict.tokens[:n_left], None
    for i, t in enumerate(new):
        if t in req.eog:
            new, finish = new[:i], "stop"
            break
    text, n_used = req.decoder.push(new)
    if req.decoder.stopped:
        new, finish = new[:n_used], "stop"
    seq.extend(new)
    if req.constraint is not None:
        req.constraint.commit(new)
        if finish is None and req.constraint.done:  # complete: nothing more allowed
            finish = "stop"
    if finish is None and (len(new) == n_left or len(seq) >= n_ctx):
        finish = "length"
    if finish:
        text += req.decoder.flush()
    return new, text, finish
