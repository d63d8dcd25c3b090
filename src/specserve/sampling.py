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

import math
import secrets
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .config import DEFAULT_VERIFY, SamplingParams, verify_method
from .processors import LogitRules
from .top_k import all_ids, top_k_and_max, top_k_ids

try:  # sampling.Noise's uniforms in C, built at install (setup.py); numpy gives the same bits without it
    from ._kernels import uniform53 as _uniform53
except ImportError:  # pragma: no cover - a build without a C compiler
    _uniform53 = None

_TOP_P_CANDIDATES = 1024  # without top-k, top-p sorts only this many first (all of them if they miss top_p)
_BOUNDED_DRAW = 4096  # rows with more candidates than this are drawn by bounds first (Sampler._draw_bounded)
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
    """Processed distributions of R rows, each on its own candidate set: most likely first where
    top-k, top-p or min-p cut it; every token in id order where nothing did (so the most likely
    token is `top()`'s, not necessarily the first).

    ids:   [R, W] int64 token ids; -1 pads a row that has fewer candidates
    probs: [R, W] float32, each row sums to 1; 0 for tokens cut by top-p or min-p, and padding
    """

    ids: np.ndarray
    probs: np.ndarray

    def __len__(self) -> int:
        return self.ids.shape[0]

    def top(self, rows: int | None = None) -> np.ndarray:
        """[rows] the most likely token's probability in each of the first `rows` rows (all: None)."""
        return self.probs[:rows].max(axis=1)

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


def stack(rows: list[Candidates]) -> Candidates:
    """One Candidates of the rows of several (in order), the narrower padded (ids -1, probabilities 0)."""
    if len(rows) == 1:
        return rows[0]
    width = max(r.ids.shape[1] for r in rows)
    if all(r.ids.shape[1] == width for r in rows):
        return Candidates(np.concatenate([r.ids for r in rows]), np.concatenate([r.probs for r in rows]))
    ids, probs = np.full((sum(map(len, rows)), width), -1, np.int64), np.zeros((sum(map(len, rows)), width),
                                                                             np.float32)
    at = 0
    for r in rows:
        ids[at : at + len(r), : r.ids.shape[1]], probs[at : at + len(r), : r.ids.shape[1]] = r.ids, r.probs
        at += len(r)
    return Candidates(ids, probs)


def candidates(logits: np.ndarray, params: SamplingParams) -> Candidates:
    """The processed distribution of each row of logits ([R, n_vocab] or [n_vocab]).

    Greedy requests get a one-hot at the argmax (the lowest id among equal maxima).
    Raises NonFiniteLogits for a row whose maximum is NaN or infinite.
    """
    z = np.atleast_2d(logits)  # [R, V]
    R, V = z.shape
    inv_t = _inverse_temperature(params)
    if inv_t == np.inf:
        ids = np.argmax(z, axis=1)
        _check_finite(z[np.arange(R), ids])
        return Candidates(ids[:, None].astype(np.int64), np.ones((R, 1), np.float32))
    if 0 < params.top_k < V:  # top-k renormalises over the k kept: the other tokens never matter again
        ids, m = top_k_and_max(z, params.top_k)  # m: [R]; NaN anywhere makes it NaN
        _check_finite(m)
        s = (z[np.arange(R)[:, None], ids] - m[:, None]) * inv_t  # [R, k] tempered, max 0
        return _cut(ids, s, np.log(np.exp(s).sum(axis=1)), params)
    m = z.max(axis=1)  # [R]; NaN anywhere makes it NaN
    _check_finite(m)
    # Vocabulary-sized arrays below are few and reused in place: each new one costs page faults.
    full = z - m[:, None]
    full *= inv_t  # [R, V] tempered, max 0 (a tiny temperature gives -inf, never NaN)
    e = np.exp(full)
    total = e.sum(axis=1)  # [R]
    lse = np.log(total)
    if params.min_p > 0:  # min-p comes last and keeps {p >= min_p p_max}: a superset of the final set
        ids = _padded([np.flatnonzero(row >= np.log(params.min_p)) for row in full])
    elif params.top_p < 1:  # the most likely first; all of them if these miss top_p
        ids = top_k_ids(full, min(_TOP_P_CANDIDATES, V))
        if (e[np.arange(R)[:, None], ids].sum(axis=1) < params.top_p * total).any():
            ids = np.broadcast_to(all_ids(V), (R, V))
    else:  # no truncation: every token is a candidate, in id order
        e /= total[:, None]
        return Candidates(np.broadcast_to(all_ids(V), (R, V)), e)
    s = np.where(ids >= 0, full[np.arange(R)[:, None], np.maximum(ids, 0)], -np.inf)
    return _cut(ids, s, lse, params)


def _cut(ids: np.ndarray, s: np.ndarray, lse: np.ndarray, params: SamplingParams) -> Candidates:
    """Sort the candidates ([R, W] ids, tempered logits s, log-normaliser lse [R]), apply top-p and min-p."""
    rows = np.arange(len(ids))[:, None]
    order = np.argsort(-s, axis=1, kind="stable")  # [R, W]; equal probabilities keep id order
    ids = ids[rows, order]
    p = np.exp(s[rows, order] - lse[:, None]).astype(np.float32, copy=False)  # [R, W]
    if params.top_p < 1:
        cum = np.cumsum(p, axis=1, dtype=np.float64)  # float32 sums drift over thousands of candidates
        p = np.where(cum - p < params.top_p - _TOP_P_TOL, p, 0.0)  # the smallest prefix reaching top_p
    if params.min_p > 0:
        p = np.where(p >= params.min_p * p[:, :1], p, 0.0)
    total = p.sum(axis=1, keepdims=True)
    if not (total > 0).all():  # the most likely token always survives: this is a bug upstream
        raise NonFiniteLogits("a processed distribution came out empty")
    return Candidates(ids, (p / total).astype(np.float32))


def _inverse_temperature(params: SamplingParams) -> np.float32:
    """1 / temperature in float32; inf for greedy and for temperatures so small that 1/T overflows
    (both take the argmax). An infinite temperature has no distribution over -inf logits: refused."""
    return np.float32(np.inf) if params.greedy else _inverse(params.temperature)


@lru_cache(maxsize=64)
def _inverse(temperature: float) -> np.float32:
    """(made once per temperature: numpy's error state costs a few microseconds a row)"""
    with np.errstate(over="ignore"):
        inv_t = np.float32(1.0 / temperature)
    if not inv_t > 0:
        raise ValueError(f"temperature must be finite, got {temperature}")
    return inv_t


def _check_finite(values: np.ndarray) -> None:
    if not np.isfinite(values).all():
        raise NonFiniteLogits("the model returned NaN or infinite logits")


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


_U32 = np.uint32
_SH8, _SH11, _SH15, _SH16 = (_U32(s) for s in (8, 11, 15, 16))
_H1, _H2, _HG = _U32(0x7FEB352D), _U32(0x846CA68B), _U32(0x9E3779B1)


def _hash32(ids: np.ndarray, key: np.ndarray) -> np.ndarray:
    """A 32-bit hash of each token id under a 32-bit key (lowbias32 of id * golden + key), uint32."""
    x = ids * _HG
    x += key
    t = x >> _SH16  # one scratch array, reused: no new vocabulary-sized array per step of the hash
    x ^= t
    x *= _H1
    np.right_shift(x, _SH15, out=t)
    x ^= t
    x *= _H2
    np.right_shift(x, _SH16, out=t)
    x ^= t
    return x


def choice_seed(seed: int | None, index: int) -> int | None:
    """The seed of choice `index` of a request that asks for several (OpenAI's n): under --verify gumbel
    the text is a function of the seed, so choices that shared one would all be the same text. Choice
    0 keeps the request's seed (n = 1 gives what the request alone gives); the others get seeds mixed
    from (seed, index), reproducible and unrelated to each other. None (no seed) stays None: each
    Sampler then draws its own."""
    if seed is None or index == 0:
        return seed
    return _mix((seed ^ _mix(index * _GOLDEN & _M64)) & _M64)


class Noise:
    """One request's randomness: every value is a pure function of (seed, position, stream, token).

    A token's uniform is u = (A 2^21 + (B >> 11) + 1/2) / 2^53 from two 32-bit hashes A, B of its id
    under keys drawn (splitmix64) from (seed, position, stream): 53 bits, so a Gumbel variate
    reaches ~37 and no probability above 1e-16 is distorted. A alone bounds u to an interval of
    2^-24, which is what lets a draw over the whole vocabulary score only the few tokens that can win.
    """

    def __init__(self, seed: int):
        self._key = _mix((seed & _M64) ^ 0x5EED5EED5EED5EED)

    def _row_keys(self, pos0: int, rows: int, stream: int) -> tuple[np.ndarray, np.ndarray]:
        """[rows, 1] uint32 keys (for A and for B) of positions pos0, pos0 + 1, ..."""
        keys = [_mix((self._key + _mix(((pos0 + r) << 2 | stream) & _M64)) & _M64) for r in range(rows)]
        return (np.array([k >> 32 for k in keys], _U32)[:, None],
                np.array([k & 0xFFFFFFFF for k in keys], _U32)[:, None])

    def uniform(self, pos: int, stream: int) -> float:
        """U(0, 1) for one position and stream."""
        return ((_mix((self._key + _mix((pos << 2 | stream) & _M64)) & _M64) >> 11) + 0.5) * 2.0**-53

    def gumbel(self, pos0: int, ids: np.ndarray, stream: int = DRAW) -> np.ndarray:
        """[R, W] float64 standard Gumbel noise for the tokens ids[r] ([R, W]) at position pos0 + r."""
        ka, kb = self._row_keys(pos0, ids.shape[0], stream)
        if _uniform53 is not None and ids.dtype == np.int64:  # the same uniforms in one C loop (_kernels.c)
            u = np.empty(ids.shape, np.float64)
            _uniform53(np.ascontiguousarray(ids), ka, kb, u)
        else:
            x = ids.astype(_U32)  # (padding, -1, wraps: its noise is never used)
            u = (_hash32(x, ka).astype(np.float64) * 2.0**21 + (_hash32(x, kb) >> _SH11) + 0.5) * 2.0**-53
        return -np.log(-np.log(u))


class Sampler:
    """How one request picks tokens: its sampling parameters, keyed noise and verify method.

    The explicit per-request source of randomness that drafters and the verifier share;
    it holds no state that changes as tokens are drawn. `rules`: the request's logit_bias and
    penalties (processors.py), which whoever has logits applies before `pick`/`process`, each row
    after its own history; None when the request has none.
    """

    def __init__(self, params: SamplingParams, method: str = DEFAULT_VERIFY):
        self.params, self.method = params, verify_method(method, params.seed)  # gumbel or rejection
        self.rules = LogitRules.of(params)
        self.noise = Noise(params.seed if params.seed is not None else secrets.randbits(64))
        self._argmax = _inverse_temperature(params) == np.inf  # greedy (or as good as)

    @property
    def greedy(self) -> bool:
        """Whether tokens are the argmax: temperature 0, or one so small that 1/T overflows."""
        return self._argmax

    def process(self, logits: np.ndarray) -> Candidates:
        return candidates(logits, self.params)

    def draw(self, dist: Candidates, pos0: int, stream: int = DRAW, weights: np.ndarray | None = None) -> np.ndarray:
        """[R] the token drawn from each row at positions pos0, pos0 + 1, ...: argmax(log p + G).

        weights: [R, W] non-negative, unnormalised, to draw from instead of dist.probs
        (a residual); same candidates.
        """
        w = dist.probs if weights is None else weights
        if w.shape[1] > _BOUNDED_DRAW:
            return np.array([self._draw_bounded(dist.ids[r], w[r], pos0 + r, stream) for r in range(len(dist))])
        with np.errstate(divide="ignore"):
            score = np.log(w, dtype=np.float64) + self.noise.gumbel(pos0, dist.ids, stream)
        return dist.ids[np.arange(len(dist)), np.argmax(score, axis=1)]

    def _draw_bounded(self, ids: np.ndarray, w: np.ndarray, pos: int, stream: int) -> int:
        """draw() for one row of many candidates ([W] ids and weights): the same token, exactly.

        argmax(log w + G) = argmax(w / E) with E = -ln u. Each token's first hash bounds u from
        above, so E from below and w / E from above (float32, one log over the row); the best
        bound's exact ratio then leaves only the few tokens that can still win, scored exactly.
        """
        ka, _ = self.noise._row_keys(pos, 1, stream)
        ids32 = all_ids(len(ids), _U32) if ids[-1] == len(ids) - 1 and ids[0] == 0 else ids.astype(_U32)
        a = _hash32(ids32, ka[0])
        a >>= _SH8
        upper = a.astype(np.float32)  # [W], then in place: u's upper bound, E's lower bound, w / E's upper bound
        upper += 1
        upper *= np.float32(2.0**-24)
        with np.errstate(divide="ignore"):
            np.log(upper, out=upper)
            np.negative(upper, out=upper)
            np.divide(w, upper, out=upper)  # inf where u may be 1
            top = int(np.argmax(upper))
            g_top = self.noise.gumbel(pos, ids[None, top : top + 1], stream)[0, 0]
            best = w[top] * np.exp(g_top)  # the exact w / E of that token (G = -ln E)
            maybe = np.flatnonzero(upper >= best * (1 - 1e-4))  # float32 rounding: a generous margin
            score = np.log(w[maybe], dtype=np.float64) + self.noise.gumbel(pos, ids[None, maybe], stream)[0]
        return int(ids[maybe[np.argmax(score)]])

    def pick(self, logits: np.ndarray, pos0: int) -> tuple[np.ndarray, Candidates | None]:
        """[R] the tokens chosen from each row of logits ([R, n_vocab] or [n_vocab]) at positions pos0...,
        and their distributions (None when greedy: the argmax needs none)."""
        if self._argmax:
            if logits.ndim == 1 or len(logits) == 1:  # a draft's one row, most often: no fancy indexing
                row = logits.reshape(-1)
                x = int(row.argmax())
                if not math.isfinite(row[x]):
                    raise NonFiniteLogits("the model returned NaN or infinite logits")
                return np.array([x]), None
            ids = logits.argmax(axis=1)
            _check_finite(logits[np.arange(len(ids)), ids])
            return ids, None
        dist = self.process(logits)
        return self.draw(dist, pos0), dist
