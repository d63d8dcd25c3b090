"""The fast paths of sampling.py (issue 64's host time) pinned to what they replaced, on random logits of a
152k vocabulary: the same candidates and probabilities bit for bit, the same keyed draws, and the greedy
draft's top probability within float32's rounding of the plain softmax."""
import numpy as np
import pytest

from specserve.config import SamplingParams
from specserve import sampling, top_k
from specserve.sampling import Noise, Sampler, candidates
from specserve.top_k import top_k_ids, top_probability

V = 151936  # Qwen2.5's vocabulary: 1187 groups of 128
SAMPLED = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=3)


def reference_top_k_ids(z: np.ndarray, k: int) -> np.ndarray:
    """The definition: the k largest of each row in id order, the lowest ids among equal values."""
    return np.stack([np.sort(np.lexsort((np.arange(z.shape[1]), -row))[:k]) for row in z])


def reference_candidates(z: np.ndarray, params: SamplingParams):
    """The top-k branch of candidates() before issue 64: the row maximum over the whole row, then the
    tempered top-k, sorted by probability, cut by top-p and min-p (what _cut does)."""
    z = np.atleast_2d(z)
    R = len(z)
    inv_t = np.float32(1.0 / params.temperature)
    m = z.max(axis=1)
    ids = reference_top_k_ids(z, params.top_k)
    s = (z[np.arange(R)[:, None], ids] - m[:, None]) * inv_t
    lse = np.log(np.exp(s).sum(axis=1))
    rows = np.arange(R)[:, None]
    order = np.argsort(-s, axis=1, kind="stable")
    ids = ids[rows, order]
    p = np.exp(s[rows, order] - lse[:, None]).astype(np.float32, copy=False)
    if params.top_p < 1:
        cum = np.cumsum(p, axis=1, dtype=np.float64)
        p = np.where(cum - p < params.top_p - 1e-6, p, 0.0)
    if params.min_p > 0:
        p = np.where(p >= params.min_p * p[:, :1], p, 0.0)
    return ids, (p / p.sum(axis=1, keepdims=True)).astype(np.float32)


def logits(rng, rows: int, n_vocab: int = V, kind: str = "model") -> np.ndarray:
    """[rows, n_vocab] float32: a model's (a broad bulk and a few dozen strong tokens), ties, or masks."""
    z = rng.normal(-4, 3, size=(rows, n_vocab)).astype(np.float32)
    for r in range(rows):
        z[r, rng.integers(0, n_vocab, 60)] += rng.uniform(5, 25, 60).astype(np.float32)
    if kind == "ties":  # many equal values around the k-th: the lowest ids must win
        z = np.round(z / 4).astype(np.float32)
    elif kind == "masked":  # a grammar's mask: most tokens -inf, a few allowed
        keep = rng.random((rows, n_vocab)) < 0.0004
        z = np.where(keep, z, -np.inf).astype(np.float32)
    elif kind == "sparse":  # a mask that allows fewer tokens than top-k keeps: the rest come from the -inf
        z = np.full((rows, n_vocab), -np.inf, np.float32)
        z[:, rng.integers(0, n_vocab, 3)] = rng.normal(size=(rows, 3))
    return z


@pytest.fixture(params=["native", "numpy"])
def kernels(request, monkeypatch):
    """Each fast path twice: through the C kernels (_kernels.c) and through numpy alone (a build without them)."""
    if request.param == "numpy":
        monkeypatch.setattr(top_k, "_exp_sum", None)
        monkeypatch.setattr(top_k, "_top_k", None)
        monkeypatch.setattr(sampling, "_uniform53", None)
    return request.param


@pytest.mark.parametrize("kind", ["model", "ties", "masked", "sparse"])
@pytest.mark.parametrize("n_vocab", [V, V - 37])  # a whole number of groups, and a remainder
def test_top_k_ids_equal_the_definition(kind, n_vocab, kernels):
    rng = np.random.default_rng(hash((kind, n_vocab)) % 2**32)
    for k in (1, 5, 40, 64, 300):
        z = logits(rng, 3, n_vocab, kind)
        if kind == "masked":
            z[:, :k] = np.maximum(z[:, :k], 0)  # at least k finite tokens a row
        assert (top_k_ids(z, k) == reference_top_k_ids(z, k)).all(), (kind, n_vocab, k)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("at", [5, V - 40])  # in a group, and in the remainder past the groups
def test_a_row_with_a_nan_or_an_infinity_has_that_maximum(bad, at, kernels):
    """What candidates() refuses a row by (NonFiniteLogits): its maximum, NaN or inf, whichever path ranks it."""
    z = logits(np.random.default_rng(5), 2, V - 37)
    z[1, at] = bad
    ids, m = top_k.top_k_and_max(z, 40)
    assert np.isfinite(m[0]) and (ids[0] == reference_top_k_ids(z[:1], 40)[0]).all()
    assert np.isnan(m[1]) if np.isnan(bad) else m[1] == np.inf


@pytest.mark.parametrize("kind", ["model", "ties"])
def test_top_k_candidates_equal_the_old_ones_bit_for_bit(kind, kernels):
    rng = np.random.default_rng(7)
    for params in (SAMPLED, SamplingParams(temperature=1.3, top_k=5), SamplingParams(temperature=0.6, top_k=300,
                                                                                      top_p=0.9)):
        for rows in (1, 9):
            z = logits(rng, rows, kind=kind)
            got = candidates(z, params)
            ids, probs = reference_candidates(z, params)
            assert (got.ids == ids).all() and (got.probs == probs).all()


def test_draws_from_the_fast_candidates_are_the_old_draws(kernels):
    """The token a seed draws (what --verify gumbel's text is made of) is unchanged: same candidates, same noise."""
    rng = np.random.default_rng(11)
    z = logits(rng, 9)
    s = Sampler(SAMPLED, "gumbel")
    tokens, dist = s.pick(z, 100)
    ids, probs = reference_candidates(z, SAMPLED)
    with np.errstate(divide="ignore"):
        score = np.log(probs, dtype=np.float64) + Noise(SAMPLED.seed).gumbel(100, ids)
    assert (tokens == ids[np.arange(9), np.argmax(score, axis=1)]).all()


def test_the_install_built_the_native_kernel():
    """setup.py builds it as optional (an install without a compiler still works, on numpy); here it must be there."""
    assert top_k.NATIVE


def test_the_noise_is_the_same_bits_through_c_and_numpy(monkeypatch):
    """What a seed draws is a pure function of (seed, position, stream, token): the C uniforms must not move it."""
    noise = Noise(12345)
    ids = np.stack([np.arange(-1, 299), np.random.default_rng(2).integers(0, V, 300)])  # padding (-1) included
    native = noise.gumbel(77, ids, 1)
    monkeypatch.setattr(sampling, "_uniform53", None)
    assert (native == noise.gumbel(77, ids, 1)).all()
    assert (noise.gumbel(5, ids[1:, ::3], 0) == Noise(12345).gumbel(5, ids[1:, ::3].copy(), 0)).all()


@pytest.mark.parametrize("shift", [-80.0, -25.0, 0.0, 40.0, 75.0])  # the largest logit in and out of exp2's range
def test_top_probability_is_the_softmax_maximum(shift, kernels):
    rng = np.random.default_rng(int(shift) + 100)
    for n_vocab in (V, V - 37, 300):
        for spread in (0.5, 3.0, 8.0):
            z = (rng.normal(0, spread, n_vocab) + shift).astype(np.float32)
            z[rng.integers(0, n_vocab, 3)] = -np.inf
            top = int(np.argmax(z))
            exact = 1.0 / np.exp(z.astype(np.float64) - z[top]).sum()
            assert top_probability(z, top) == pytest.approx(exact, rel=2e-6, abs=1e-9)
            scratch = np.empty(n_vocab, np.float32)
            assert top_probability(z, top, scratch) == top_probability(z, top)


def reference_verify(draft, draft_dists, z, sampler, pos0):
    """verify() before issue 64: every row processed at once, then judged (verifier.py's docstring)."""
    from specserve.sampling import ACCEPT, DRAW, RESIDUAL
    from specserve.verifier import _probs_at

    k = len(draft)
    if sampler.greedy or sampler.method == "gumbel":
        target, p = sampler.pick(z, pos0)
        n = next((i for i, x in enumerate(draft) if int(target[i]) != x), k)
        return n, [*draft[:n], int(target[n])], p
    p = sampler.process(z)
    for i, x in enumerate(draft):
        p_x, q_x = p.prob(i, x), draft_dists[i].prob(0, x)
        if p_x > 0 and sampler.noise.uniform(pos0 + i, ACCEPT) * q_x < p_x:
            continue
        residual = np.maximum(p.probs[i] - _probs_at(draft_dists[i], p.ids[i]), 0.0)
        residual = residual if residual.sum() > 0 else p.probs[i]
        return i, [*draft[:i], int(sampler.draw(p.row(i), pos0 + i, RESIDUAL, weights=residual[None])[0])], p
    return k, [*draft, int(sampler.draw(p.row(k), pos0 + k, DRAW)[0])], p


@pytest.mark.parametrize("method", ["gumbel", "rejection"])
@pytest.mark.parametrize("params", [SAMPLED, SamplingParams(temperature=0.0)])
def test_verification_row_by_row_is_the_verification_of_all_rows(method, params):
    """Verification stops processing rows at the one that decides; the verdict, and the distributions of the
    rows it reports, are those of processing every row at once."""
    from specserve.verifier import verify

    rng, seen = np.random.default_rng(5), set()
    for trial in range(12):
        z = logits(rng, 9)
        sampler = Sampler(SamplingParams(**{**params.__dict__, "seed": trial}), method)
        q_logits = z[:8] + rng.normal(0, 1.5, size=(8, V)).astype(np.float32)  # a draft near the target
        drafted, dists = sampler.pick(q_logits, 40)
        draft = [int(x) for x in drafted]
        dists = None if dists is None else [dists.row(i) for i in range(8)]
        v = verify(draft, dists, z, sampler, 40)
        n, tokens, p = reference_verify(draft, dists, z, sampler, 40)
        assert (v.n_accepted, v.tokens) == (n, tokens), trial
        seen.add(n)
        if p is not None:
            assert (v.target.ids == p.ids[: n + 1]).all() and (v.target.probs == p.probs[: n + 1]).all()
    assert len(seen) > 2, seen  # drafts rejected early, late and not at all
