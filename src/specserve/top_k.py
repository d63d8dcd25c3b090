"""Selections over a row of logits as big as a vocabulary, without sorting it: the top k ids (by the
strided groups' maxima first) and the largest probability of the raw softmax. Sampling (sampling.py),
logprobs and the draft model's confidence read a 152k-entry row a step each; these keep that under a
tenth of a millisecond.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

GROUP = 128  # top-k looks for the best of V / GROUP groups of this many logits first

try:  # the kernels built at install (setup.py, _kernels.c); numpy does the same without them
    from ._kernels import exp_sum as _exp_sum, top_k as _top_k
except ImportError:  # pragma: no cover - a build without a C compiler
    _exp_sum = _top_k = None
NATIVE = _exp_sum is not None


@lru_cache(maxsize=8)
def all_ids(n: int, dtype=np.int64) -> np.ndarray:
    """arange(n), read-only and made once per size (a vocabulary-sized array costs page faults)."""
    ids = np.arange(n, dtype=dtype)
    ids.flags.writeable = False
    return ids


def top_k_ids(z: np.ndarray, k: int) -> np.ndarray:
    """[R, k] the ids of the k largest of each row of z ([R, V]), in id order.

    Among equal values at the k-th place the lowest ids win. Rows with a NaN get some k ids (the first k).
    """
    return top_k_and_max(z, k)[0]


def top_k_and_max(z: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(top_k_ids, [R] each row's maximum: NaN where it has a NaN), without sorting or partitioning the
    vocabulary, a row at a time (a row of 152k float32 logits stays in L2 between its two reads).

    Group j holds the ids equal to j modulo n_groups (V // GROUP of them): a strided reshape, so the
    group maxima cost one vectorised pass, and the row's maximum is theirs. The k largest group maxima are
    k distinct entries, so the k-th largest entry is at least g, the k-th largest group maximum: the k
    largest lie among the entries >= g, all in the groups whose maximum reaches g (usually k groups and a
    few more than k entries, which are then ranked).
    """
    R, V = z.shape
    n_groups = V // GROUP
    ids, m = np.empty((R, k), np.int64), np.empty(R, z.dtype)
    native = _top_k is not None and z.dtype == np.float32 and z.flags.c_contiguous
    for r in range(R):
        row = z[r]
        if native:  # the same selection in one pass of C (_kernels.c), for the usual rows
            top = _top_k(row, k, ids[r])
            if top is not None:
                m[r] = top
                continue
        if n_groups <= 2 * k:  # a small vocabulary: rank it whole
            m[r] = row.max()
            ids[r] = _rank(all_ids(V), row, k, in_order=True) if m[r] == m[r] else all_ids(k)
            continue
        full = n_groups * GROUP
        gm = row[:full].reshape(GROUP, n_groups).max(axis=0)  # [n_groups]
        m[r] = np.maximum(gm.max(), row[full:].max()) if full < V else gm.max()  # (NaN propagates)
        if m[r] != m[r]:  # NaN: some k ids (the caller refuses the row by its maximum)
            ids[r] = all_ids(k)
            continue
        g = np.partition(gm, n_groups - k)[n_groups - k]
        if not g > -np.inf:  # fewer than k groups hold a finite logit (a grammar's mask), or NaN
            ids[r] = _top_k_masked(row, k)
            continue
        cand = (np.nonzero(gm >= g)[0] + _group_offsets(n_groups)).ravel()
        if full < V:
            cand = np.concatenate([cand, np.arange(full, V)])
        vals = row[cand]
        keep = vals >= g
        n = np.count_nonzero(keep)
        if n == k:  # the k largest
            ids[r] = np.sort(cand[keep])
        elif n > k:
            ids[r] = _rank(cand[keep], vals[keep], k)
        else:  # (cannot happen: k groups reach g, each with an entry >= g)
            ids[r] = _rank(all_ids(V), row, k, in_order=True)
    return ids, m


def _top_k_masked(row: np.ndarray, k: int) -> np.ndarray:
    """[k] `top_k_and_max` of a row ([V]) whose finite logits lie in fewer than k groups: among them, and if they are
    fewer than k, the lowest ids of the -inf ones (partitioning a row of equal values is slow)."""
    fin = np.flatnonzero(row > -np.inf)
    low = np.flatnonzero(row == -np.inf)[: max(k - len(fin), 0)]
    if len(fin) >= k:
        return _rank(fin, row[fin], k, in_order=True)
    if len(fin) + len(low) == k:
        return np.sort(np.concatenate([fin, low]))
    return _rank(all_ids(len(row)), row, k, in_order=True)  # NaN in the row


@lru_cache(maxsize=8)
def _group_offsets(n_groups: int) -> np.ndarray:
    """[GROUP, 1] the offsets of a group's ids from its first (made once per vocabulary size)."""
    out = n_groups * np.arange(GROUP)[:, None]
    out.flags.writeable = False
    return out


def _rank(ids: np.ndarray, vals: np.ndarray, k: int, in_order: bool = False) -> np.ndarray:
    """[k] in id order: the ids of the k largest vals (ids [W] distinct, in increasing order if in_order;
    vals [W]), the lowest ids among equal values at the k-th place."""
    if len(ids) > 8 * k:  # many: partition first, sort only where the k-th value is tied
        top = np.argpartition(vals, len(vals) - k)[len(vals) - k:]
        kth = vals[top].min()
        if np.count_nonzero(vals >= kth) == k:
            return np.sort(ids[top])
        above, tied = ids[vals > kth], ids[vals == kth]
        tied = tied if in_order else np.sort(tied)
        return np.sort(np.concatenate([above, tied[: k - len(above)]]))
    return np.sort(ids[np.lexsort((ids, -vals))[:k]])


_LOG2E = np.float32(np.log2(np.e))


def top_probability(z: np.ndarray, top: int, scratch: np.ndarray | None = None) -> float:
    """The raw softmax's largest probability, 1 / sum(exp(z - z[top])), z: [V] logits (largest finite),
    top: its argmax. To about 1e-6 (float32's own exp and sums), more than its readers need: the
    confidence stop and its learning read it by buckets 0.01 wide or wider.

    One pass of the native kernel (_kernels.c: 30 us for a 152k vocabulary on this CPU) where it is
    built and z is C-contiguous float32; else as exp2(z log2(e)), which costs half what exp does, in
    `scratch` ([V] float32, reused: a new vocabulary-sized array costs page faults), summed by einsum
    (float32 in SIMD lanes), 60 us. There the largest logit is subtracted only where a term could
    overflow or the largest underflow: the ratio is the same."""
    m = float(z[top])
    if _exp_sum is not None and z.dtype == np.float32 and z.flags.c_contiguous:
        return 1.0 / _exp_sum(z, m)
    e = scratch if scratch is not None and scratch.shape == z.shape else np.empty(z.shape, np.float32)
    if -30.0 < m < 60.0:
        np.multiply(z, _LOG2E, out=e)
    else:
        np.subtract(z, np.float32(m), out=e)
        e *= _LOG2E
    np.exp2(e, out=e)
    return float(e[top]) / float(np.einsum("i->", e))
