"""What changes the logits before a token is chosen: logit_bias, then llama.cpp's repetition penalties.

In llama.cpp's order (common/sampling.cpp builds the chain with the logit-bias sampler first, then
`penalties` first among the samplers): the bias is added, then each token seen c > 0 times among the
last `repeat_last_n` tokens of prompt and output (llama-server feeds the prompt to the sampler, so it
counts) has its logit divided by repeat_penalty where positive, multiplied by it where <= 0, then
lowered by c * frequency_penalty + presence_penalty (OpenAI's formula; its window is the output alone).
All of it in float32, as llama.cpp computes it.

Both change the target's distribution, and speculation stays lossless relative to the changed one only
if every verified row is changed as the target alone would change it: row i of a verification pass
follows the committed sequence and draft tokens 0..i-1, so its penalties count that row's own history
(the committed window's counts, then one token in and at most one out per row: a cumulative sum, no
loop over the vocabulary). A draft model drafts under the same rules, or it would propose what the
changed target no longer says.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from .config import SamplingParams


class LogitRules:
    """One request's logit_bias and penalties; holds no state that changes as tokens are committed."""

    def __init__(self, params: SamplingParams):
        added = [(t, b) for t, b in params.logit_bias if b != math.inf]
        self.bias_ids = np.array([t for t, _ in added], np.int64)
        self.bias = np.array([b for _, b in added], np.float32)
        # +inf forces: only these tokens can be drawn (adding inf to a logit would make the row NaN)
        self.forced = np.array([t for t, b in params.logit_bias if b == math.inf], np.int64)
        self.penalized = params.penalized
        self.last_n = None if params.repeat_last_n == -1 else params.repeat_last_n  # None: the whole sequence
        self.repeat = np.float32(params.repeat_penalty)
        self.frequency = np.float32(params.frequency_penalty)
        self.presence = np.float32(params.presence_penalty)

    @classmethod
    def of(cls, params: SamplingParams) -> "LogitRules | None":
        """The request's rules; None when they would change nothing (the default: no cost at all)."""
        return cls(params) if params.logit_bias or params.penalized else None

    @staticmethod
    def check(params: SamplingParams, n_vocab: int) -> None:
        """ValueError for a logit_bias token the target does not have (refused, never ignored), for text
        not yet tokenized (with_bias_text), and for a bias that leaves no token possible."""
        if params.bias_text:
            raise ValueError("logit_bias text must be tokenized first (processors.with_bias_text)")
        bad = [t for t, _ in params.logit_bias if t >= n_vocab]
        if bad:
            raise ValueError(f"logit_bias names token {bad[0]}, but the model's vocabulary has {n_vocab} tokens")
        if sum(b == -math.inf for _, b in params.logit_bias) >= n_vocab:
            raise ValueError(f"logit_bias forbids every one of the model's {n_vocab} tokens: nothing could be "
                             "generated")

    def window(self, seq: Sequence[int]) -> list[int]:
        """The part of seq that penalties can see: its last repeat_last_n tokens (all for -1; none
        without penalties)."""
        if not self.penalized:
            return []
        return list(seq if self.last_n is None else seq[-self.last_n:])

    def apply(self, logits: np.ndarray, history: Sequence[int], draft: Sequence[int] = ()) -> np.ndarray:
        """A float32 copy of logits ([R, V] or [V]) under the rules; row i follows history + draft[:i]."""
        z = np.array(logits, dtype=np.float32, ndmin=2)  # [R, V], a copy
        V = z.shape[1]
        if len(self.bias_ids):
            inside = self.bias_ids < V  # a token past this model's vocabulary (a smaller draft's) has no logit
            z[:, self.bias_ids[inside]] += self.bias[inside]
        if len(self.forced):
            forced = self.forced[self.forced < V]
            if len(forced):  # (a draft without any of them drafts freely: the target refuses its tokens)
                kept = z[:, forced]
                z[:] = -np.inf
                z[:, forced] = kept
        if self.penalized:
            self._penalize(z, history, draft)
        return z.reshape(np.shape(logits)) if np.ndim(logits) == 1 else z

    def counts(self, history: Sequence[int], draft: Sequence[int], rows: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids [U], counts [rows, U]): how often each token occurs in row i's window, the last last_n
        tokens of history + draft[:i]."""
        n = self.last_n
        head = list(history[-n:] if n is not None else history)
        s = len(head)
        ext = np.array(head + list(draft[: rows - 1]), np.int64)  # [s + rows - 1]
        ids, inv = np.unique(ext, return_inverse=True)
        delta = np.zeros((rows, len(ids)), np.int32)
        delta[0] = np.bincount(inv[:s], minlength=len(ids))
        if rows > 1:
            r = np.arange(1, rows)
            np.add.at(delta, (r, inv[s + r - 1]), 1)  # draft token i - 1 enters row i's window
            if n is not None:
                out = s + r - 1 - n  # ext's index of the token that leaves it, where one does
                np.add.at(delta, (r[out >= 0], inv[out[out >= 0]]), -1)
        return ids, np.cumsum(delta, axis=0)

    def _penalize(self, z: np.ndarray, history: Sequence[int], draft: Sequence[int]) -> None:
        """llama_sampler_penalties_apply on each row of z ([R, V], in place)."""
        ids, c = self.counts(history, draft, len(z))
        keep = ids < z.shape[1]
        ids, c = ids[keep], c[:, keep]  # [U], [R, U]
        g = z[:, ids]
        seen = c > 0
        pen = np.where(g <= 0, g * self.repeat, g / self.repeat)
        pen -= c.astype(np.float32) * self.frequency + seen.astype(np.float32) * self.presence
        z[:, ids] = np.where(seen, pen, g)


def with_bias_text(params: SamplingParams, model) -> SamplingParams:
    """The params with their bias_text tokenized into logit_bias (each of a text's tokens gets its bias,
    as llama-server's text keys do). Tokenizing is slow for long texts: the server calls this off its
    event loop, with the prompt's tokenization."""
    if not params.bias_text:
        return params
    pairs = list(params.logit_bias)
    for text, bias in params.bias_text:
        pairs += [(t, bias) for t in model.tokenize(text, add_special=False)]
    return dataclasses.replace(params, logit_bias=tuple(pairs), bias_text=())
