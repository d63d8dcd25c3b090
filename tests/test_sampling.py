"""The processed distribution: temperature, top-k, top-p, min-p."""
import numpy as np
import pytest

from specserve.config import SamplingParams
from specserve.sampling import process


def test_greedy_is_one_hot():
    p = process(np.array([0.1, 3.0, 2.0]), SamplingParams(temperature=0))
    assert p.tolist() == [0.0, 1.0, 0.0]


def test_temperature_one_is_softmax():
    x = np.array([1.0, 2.0, 3.0])
    p = process(x, SamplingParams(temperature=1.0))
    e = np.exp(x - 3)
    assert np.allclose(p, e / e.sum(), atol=1e-7)  # float32, like the logits


def test_top_k_keeps_k_largest():
    p = process(np.array([1.0, 4.0, 3.0, 2.0]), SamplingParams(temperature=1.0, top_k=2))
    assert p[0] == 0 and p[3] == 0 and abs(p.sum() - 1) < 1e-6 and p[1] > p[2] > 0


def test_top_p_keeps_smallest_set_reaching_p():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    p = process(np.log(probs), SamplingParams(temperature=1.0, top_p=0.8))
    assert np.allclose(p, [0.5 / 0.8, 0.3 / 0.8, 0, 0])
    p = process(np.log(probs), SamplingParams(temperature=1.0, top_p=0.81))
    assert np.count_nonzero(p) == 3


def test_top_p_large_vocab_falls_back_to_full_sort():
    # flat distribution over 5000 tokens: the 1024 candidates cannot reach 0.9
    x = np.zeros(5000)
    p = process(x, SamplingParams(temperature=1.0, top_p=0.9))
    assert np.count_nonzero(p) == 4500


def test_min_p_drops_tokens_below_fraction_of_max():
    probs = np.array([0.6, 0.3, 0.07, 0.03])
    p = process(np.log(probs), SamplingParams(temperature=1.0, min_p=0.1))
    assert p[3] == 0 and p[2] > 0


def test_every_distribution_guarded_against_nan_and_inf():
    """NaN or infinite logits raise a clear error instead of sampling garbage; the smallest
    temperature that is not greedy (1e-5) still gives a finite distribution, its argmax first."""
    import numpy as np

    from specserve.config import SamplingParams
    from specserve.sampling import NonFiniteLogits, candidates

    logits = np.array([[0.5, 3.0, -1.0, 2.999], [1.0, 1.0, 0.0, -5.0]], np.float32)
    for params in (SamplingParams(), SamplingParams(temperature=0.8), SamplingParams(temperature=0.8, top_k=2),
                   SamplingParams(temperature=0.8, top_p=0.9), SamplingParams(temperature=0.8, min_p=0.1)):
        for value in (np.nan, np.inf):
            bad = logits.copy()
            bad[1, 2] = value
            with pytest.raises(NonFiniteLogits):
                candidates(bad, params)
        c = candidates(logits, params)
        assert np.isfinite(c.probs).all() and np.allclose(c.probs.sum(axis=1), 1.0)
    tiny = candidates(logits, SamplingParams(temperature=1e-5))
    assert np.isfinite(tiny.probs).all() and int(np.argmax(tiny.dense(0, 4))) == 1
    assert SamplingParams(temperature=1e-40).greedy


# --- candidates, keyed noise and draws ---------------------------------------------------------------

import pytest  # noqa: E402

from specserve.sampling import Candidates, NonFiniteLogits, Noise, Sampler, candidates  # noqa: E402
from specserve.top_k import top_k_ids  # noqa: E402


def test_top_k_is_exact_with_ties_and_infinities():
    rng = np.random.default_rng(0)
    for trial in range(150):
        V = int(rng.choice([50, 300, 5000, 18992, 19069]))
        R, k = int(rng.integers(1, 4)), int(rng.integers(1, min(60, V)))
        z = rng.normal(size=(R, V)).astype(np.float32)
        if trial % 3 == 0:
            z = np.round(z, 1)  # many ties at the k-th value: the lowest ids win
        if trial % 5 == 0:
            z[:, rng.integers(0, V, size=V // 2)] = -np.inf
        got = top_k_ids(z, k)
        for r in range(R):
            assert (got[r] == np.sort(np.lexsort((np.arange(V), -z[r]))[:k])).all(), (trial, V, k)


def test_rows_together_equal_rows_one_at_a_time():
    z = np.random.default_rng(1).normal(size=(9, 3000)).astype(np.float32) * 3
    for params in (SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
                   SamplingParams(temperature=1.2, top_p=0.9), SamplingParams(temperature=0.7, min_p=0.1),
                   SamplingParams(temperature=1.0)):
        together = candidates(z, params)
        for r in range(9):
            alone = candidates(z[r], params)
            assert np.allclose(together.dense(r, 3000), alone.dense(0, 3000), atol=1e-7)


def test_nan_or_infinite_logits_raise():
    for params in (SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_k=5)):
        for bad in (np.nan, np.inf):
            z = np.zeros(10, np.float32)
            z[3] = bad
            with pytest.raises(NonFiniteLogits):
                candidates(z, params)
    assert candidates(np.array([0.0, -np.inf, 1.0]), SamplingParams(temperature=1.0)).prob(0, 1) == 0.0


def test_noise_is_a_function_of_seed_position_and_token():
    a, b = Noise(7), Noise(7)
    ids = np.array([[3, 10, 99]])
    assert (a.gumbel(5, ids) == b.gumbel(5, np.array([[99, 3, 10]]))[:, [1, 2, 0]]).all()  # order and company
    assert (a.gumbel(5, ids) != a.gumbel(6, ids)).all() and (a.gumbel(5, ids) != Noise(8).gumbel(5, ids)).all()
    assert (a.gumbel(5, ids, stream=1) != a.gumbel(5, ids)).all()
    g = Noise(1).gumbel(0, np.arange(200000)[None])[0]
    assert abs(g.mean() - 0.5772) < 0.01 and abs(g.std() - 1.2825) < 0.01  # standard Gumbel


def test_a_draw_over_many_candidates_is_the_plain_argmax():
    rng = np.random.default_rng(2)
    for trial in range(60):
        V = int(rng.choice([5000, 20000]))
        w = rng.dirichlet(np.full(V, rng.choice([0.01, 0.1, 1.0]))).astype(np.float32)[None]
        w[0, rng.integers(0, V, V // 3)] = 0
        dist, s = Candidates(np.arange(V)[None], w), Sampler(SamplingParams(temperature=1.0, seed=trial))
        with np.errstate(divide="ignore"):
            plain = np.argmax(np.log(w[0].astype(np.float64)) + s.noise.gumbel(9, dist.ids)[0])
        assert s.draw(dist, 9)[0] == plain


def test_draws_over_a_large_vocabulary_follow_the_distribution():
    V, n = 8000, 20000
    z = np.full(V, -4.0, np.float32)
    z[[5, 700, 6000]] = [2.0, 1.0, 0.0]  # three likely tokens and a long tail holding ~55% of the mass
    params = SamplingParams(temperature=1.0)
    p = process(z, params)
    counts = np.zeros(4)
    for seed in range(n):
        t = Sampler(SamplingParams(temperature=1.0, seed=seed)).pick(z, 0)[0][0]
        counts[[5, 700, 6000].index(t) if t in (5, 700, 6000) else 3] += 1
    expected = np.array([p[5], p[700], p[6000], 1 - p[5] - p[700] - p[6000]])
    assert 0.5 * np.abs(counts / n - expected).sum() < 0.01, (counts / n, expected)


def test_extreme_temperatures_are_guarded():
    z = np.array([0.0, -np.inf, 2.0, 2.0 - 1e-3], np.float32)
    tiny = Sampler(SamplingParams(temperature=1e-300, seed=1))  # 1 / T overflows: the argmax, never NaN
    assert tiny.greedy and tiny.pick(z, 0)[0][0] == 2 and candidates(z, tiny.params).ids[0, 0] == 2
    small = candidates(z, SamplingParams(temperature=1e-30))
    assert np.isfinite(small.probs).all() and small.prob(0, 2) == 1.0
    with pytest.raises(ValueError, match="temperature must be in"):  # refused before any sampling
        SamplingParams(temperature=float("inf"))


def test_the_top_probability_of_an_untruncated_row_is_its_largest():
    """No top-k, top-p or min-p: candidates stay in id order, so the most likely is not the first."""
    z = np.array([[0.0, 3.0, 1.0, 2.0], [5.0, 0.0, 0.0, 0.0]], np.float32)
    c = candidates(z, SamplingParams(temperature=1.0))
    assert list(c.ids[0]) == [0, 1, 2, 3]
    want = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    assert c.top() == pytest.approx(want.max(axis=1)) and c.top(1) == pytest.approx(want[:1].max(axis=1))
    cut = candidates(z, SamplingParams(temperature=1.0, top_p=0.9))  # sorted: the same answer
    assert cut.top() == pytest.approx(candidates(z, SamplingParams(temperature=1.0, top_p=0.9)).probs[:, 0])
