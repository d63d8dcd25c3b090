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
