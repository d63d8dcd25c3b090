"""Logits -> processed distributions, and the keyed draws that pick tokens from them.

Processing: temperature, then top-k, top-p and min-p on the tempered distribution (as
vLLM orders them). All rows of a step go through one call, in float32, each row on its
own candidate set: the top-k first, as llama.cpp does, found without sorting the
vocabulary; top-p and min-p then keep a prefix of the candidates sorted by probability.
The target's p and the draft's q go through the same code, which is what makes
verification lossless for processed distributions.

Draws are keyed, never sequential: the noise for the token at sequence position i is a
pure function of (seed, i, stream, token id) (`Noise`), so nothing depends on how many
draws came before. A draw is the Gumbel-max argmax_x(log p(x) + G_i(x)), an exact sample
from p. A draft model that drafts position i with the same G_i proposes the target's own
token whenever the two distributions allow it (verifier.py).
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass

import numpy as np

from .config import DEFAULT_VERIFY, VERIFY_METHODS, SamplingParams

_TOP_P_CANDIDATES = 1024  # without top-k, top-p sorts only this many first (all of them if they miss top_p)
_GROUP = 128  # top-k looks for the best of V / _GROUP groups of this many logits first
_TOP_P_TOL = 1e-6  # float32 cumulative sums: a mass this close to top_p counts as reaching it
_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15

# Noise streams: independent noise for the different uses of one position.
DRAW = 0  # the token drawn at a position: the target's and, coupled, the drafter's
ACCEPT = 1  # rejection sampling's acceptance test
RESIDUAL = 2  # rejection sampling's draw from the residual after a rejection


class NonFiniteLogits(RuntimeError):
    """The model returned NaN or infinite logits: no distribution can be formed."""


@dataclass(frozen=True)
class Candidates:
    """Processed distributions of R rows, each on its own candidate set, most likely first.

    ids:   [R, W] int64 token ids; -1 pads a row that has fewer candidates
    probs: [R, W] float32, each row sums to 1; 0 for tokens cut by top-p or min-p, and padding
    """

    ids: np.ndarray
    probs: np.ndarray

    def __len__(self) -> int:
        return self.ids.shape[0]

    def row(self, i: int) -> "Candidates":
        return Candidates(self.ids[i : i + 1], self.probs[i : i + 1])

    def prob(self, i: int, token: int) -> float:
        """p(token) in row i (0 for a token outside the row's candidates, or beyond the vocabulary)."""
        return float(self.probs[i][self.ids[i] == token].sum())

    def dense(self, i: int, n_vocab: int) -> np.ndarray:
        """Row i as a float64 vector over the vocabulary, [n_vocab], normalised again in float64."""
        out = np.zeros(n_vocab)
        keep = self.probs[i] > 0
        out[self.ids[i][keep]] = self.probs[i][keep]
        return out / out.sum()


def candidates(logits: np.ndarray, params: SamplingParams) -> Candidates:
    """The processed distribution of each row of logits ([R, n_vocab] or [n_vocab]).

    Greedy requests get a one-hot at the argmax (the lowest id among equal maxima).
    Raises NonFiniteLogits for a row whose maximum is NaN or infinite.
    """
    z = np.atleast_2d(logits)  # [R, V]
    R, V = z.shape
    if params.greedy:
        ids = np.argmax(z, axis=1)
        _check_finite(z[np.arange(R), ids])
        return Candidates(ids[:, None].astype(np.int64), np.ones((R, 1), np.float32))
    m = z.max(axis=1)  # [R]; NaN anywhere makes it NaN
    _check_finite(m)
    inv_t = np.float32(1.0 / params.temperature)
    if 0 < params.top_k < V:  # top-k renormalises over the k kept: the other tokens never matter again
        ids = _top_k(z, params.top_k)
        s = (np.take_along_axis(z, ids, axis=1) - m[:, None]) * inv_t  # [R, k] tempered, max 0
        return _cut(ids, s, np.log(np.exp(s).sum(axis=1)), params)
    full = (z - m[:, None]) * inv_t  # [R, V] tempered, max 0 (a tiny temperature gives -inf, never NaN)
    lse = np.log(np.exp(full).sum(axis=1))  # [R]
    if params.min_p > 0:  # min-p comes last and keeps {p >= min_p p_max}: a superset of the final set
        ids = _padded([np.flatnonzero(row >= np.log(params.min_p)) for row in full])
    elif params.top_p < 1:  # the most likely first; all of them if these miss top_p
        ids = _top_k(full, min(_TOP_P_CANDIDATES, V))
        if (np.exp(np.take_along_axis(full, ids, axis=1) - lse[:, None]).sum(axis=1) < params.top_p).any():
            ids = np.broadcast_to(np.arange(V), (R, V))
    else:  # no truncation: every token is a candidate, in id order
        probs = np.exp(full - lse[:, None])
        return Candidates(np.broadcast_to(np.arange(V), (R, V)), probs / probs.sum(axis=1, keepdims=True))
    s = np.where(ids >= 0, np.take_along_axis(full, np.maximum(ids, 0), axis=1), -np.inf)
    return _cut(ids, s, lse, params)


def _cut(ids: np.ndarray, s: np.ndarray, lse: np.ndarray, params: SamplingParams) -> Candidates:
    """Sort the candidates ([R, W] ids, tempered logits s, log-normaliser lse [R]), apply top-p and min-p."""
    order = np.argsort(-s, axis=1, kind="stable")  # [R, W]; equal probabilities keep id order
    ids = np.take_along_axis(ids, order, axis=1)
    p = np.exp(np.take_along_axis(s, order, axis=1) - lse[:, None]).astype(np.float32)  # [R, W]
    if params.top_p < 1:
        cum = np.cumsum(p, axis=1, dtype=np.float64)  # float32 sums drift over thousands of candidates
        p = np.where(cum - p < params.top_p - _TOP_P_TOL, p, 0.0)  # the smallest prefix reaching top_p
    if params.min_p > 0:
        p = np.where(p >= params.min_p * p[:, :1], p, 0.0)
    total = p.sum(axis=1, keepdims=True)
    if not (total > 0).all():  # the most likely token always survives: this is a bug upstream
        raise NonFiniteLogits("a processed distribution came out empty")
    return Candidates(ids, (p / total).astype(np.float32))


def _check_finite(values: np.ndarray) -> None:
    if not np.isfinite(values).all():
        raise NonFiniteLogits("the model returned NaN or infinite logits")


def _top_k(z: np.ndarray, k: int) -> np.ndarray:
    """[R, k] the ids of the k largest of each row of z ([R, V]), in id order.

    Without sorting or partitioning the vocabulary: ids are split into groups of those equal
    modulo n_groups (a strided reshape, so the group maxima cost one vectorised pass); the
    k largest lie in the k groups with the largest maxima, and only those are partitioned.
    Among equal values at the k-th place the lowest ids win.
    """
    R, V = z.shape
    n_groups = V // _GROUP
    out = np.empty((R, k), np.int64)
    for r in range(R):
        row = z[r]
        if n_groups <= 2 * k:  # a small vocabulary: partition it whole
            ids = np.arange(V)
        else:
            full = n_groups * _GROUP
            group_max = row[:full].reshape(_GROUP, n_groups).max(axis=0)  # [n_groups]
            groups = np.argpartition(group_max, n_groups - k)[n_groups - k:]  # the k best groups
            ids = (groups + n_groups * np.arange(_GROUP)[:, None]).ravel()  # [k * _GROUP]
            if full < V:
                ids = np.concatenate([ids, np.arange(full, V)])
        vals = row[ids]
        top = ids[np.argpartition(vals, len(ids) - k)[len(ids) - k:]]
        kth = row[top].min()
        if np.count_nonzero(vals >= kth) != k or (
                len(ids) < V and np.count_nonzero(group_max >= kth) != np.count_nonzero(group_max[groups] >= kth)):
            # a tie at the k-th value (or a group left out reaches it): take the lowest ids among the tied
            above, tied = np.flatnonzero(row > kth), np.flatnonzero(row == kth)
            top = np.concatenate([above, tied[: k - len(above)]])
        out[r] = np.sort(top)
    return out


def _padded(rows: list[np.ndarray]) -> np.ndarray:
    """[R, max len] int64 from rows of different lengths, padded with -1."""
    out = np.full((len(rows), max(len(r) for r in rows)), -1, np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def process(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The processed distribution of one row of logits as a float64 vector, [n_vocab]."""
    return candidates(logits, params).dense(0, logits.shape[-1])


# --- keyed noise -------------------------------------------------------------------------------


def _mix(x: int) -> int:
    """splitmix64's finalizer on a 64-bit Python int."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


_S30, _S27, _S31, _S11 = (np.uint64(s) for s in (30, 27, 31, 11))
_C1, _C2, _CG = (np.uint64(c) for c in (0xBF58476D1CE4E5B9, 0x94D049BB133111EB, _GOLDEN))


def _mix_array(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on a uint64 array (wrapping arithmetic)."""
    x = (x ^ (x >> _S30)) * _C1
    x = (x ^ (x >> _S27)) * _C2
    return x ^ (x >> _S31)


class Noise:
    """One request's randomness: every value is a pure function of (seed, position, stream, token).

    Splitmix64 hashing of a counter, the construction of splitmix64 itself; uniforms carry
    53 bits, so a Gumbel variate reaches ~37 and no probability above 1e-16 is distorted.
    """

    def __init__(self, seed: int):
        self._key = _mix((seed & _M64) ^ 0x5EED5EED5EED5EED)

    def _row_key(self, pos: int, stream: int) -> int:
        return _mix((self._key + _mix((pos << 2 | stream) & _M64)) & _M64)

    def uniform(self, pos: int, stream: int) -> float:
        """U(0, 1) for one position and stream."""
        return ((_mix(self._row_key(pos, stream)) >> 11) + 0.5) * 2.0**-53

    def gumbel(self, pos0: int, ids: np.ndarray, stream: int = DRAW) -> np.ndarray:
        """[R, W] float64 standard Gumbel noise for the tokens ids[r] at position pos0 + r."""
        keys = np.array([self._row_key(pos0 + r, stream) for r in range(ids.shape[0])], np.uint64)
        with np.errstate(over="ignore"):
            h = _mix_array(keys[:, None] + ids.astype(np.uint64) * _CG)
        u = ((h >> _S11).astype(np.float64) + 0.5) * 2.0**-53
        return -np.log(-np.log(u))


class Sampler:
    """How one request picks tokens: its sampling parameters, keyed noise and verify method.

    The explicit per-request source of randomness that drafters and the verifier share;
    it holds no state that changes as tokens are drawn.
    """

    def __init__(self, params: SamplingParams, method: str = DEFAULT_VERIFY):
        if method not in VERIFY_METHODS:
            raise ValueError(f"verify method must be one of {', '.join(VERIFY_METHODS)}, got {method!r}")
        self.params, self.method = params, method
        self.noise = Noise(params.seed if params.seed is not None else secrets.randbits(64))

    @property
    def greedy(self) -> bool:
        return self.params.greedy

    def process(self, logits: np.ndarray) -> Candidates:
        return candidates(logits, self.params)

    def draw(self, dist: Candidates, pos0: int, stream: int = DRAW, weights: np.ndarray | None = None) -> np.ndarray:
        """[R] the token drawn from each row at positions pos0, pos0 + 1, ...: argmax(log p + G).

        weights: [R, W] non-negative, unnormalised, to draw from instead of dist.probs
        (a residual); same candidates.
        """
        w = dist.probs if weights is None else weights
        with np.errstate(divide="ignore"):
            score = np.where(w > 0, np.log(w, dtype=np.float64), -np.inf) + self.noise.gumbel(pos0, dist.ids, stream)
        return dist.ids[np.arange(len(dist)), np.argmax(score, axis=1)]

    def pick(self, logits: np.ndarray, pos0: int) -> tuple[np.ndarray, Candidates]:
        """[R] the tokens chosen from each row of logits at positions pos0..., and their distributions."""
        dist = self.process(logits)
        return (dist.ids[:, 0] if self.greedy else self.draw(dist, pos0)), dist
