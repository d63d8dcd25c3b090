"""Table tests for the verifier, from hand-made distributions (no model involved)."""
import numpy as np
import pytest

from specserve.config import SamplingParams
from specserve.sampling import process
from specserve.verifier import verify, verify_greedy

V = 6
GREEDY = SamplingParams(temperature=0.0)
T1 = SamplingParams(temperature=1.0)


def logits_peaked(*argmaxes, margin=5.0):
    """[len(argmaxes), V] logits whose row i has its maximum at argmaxes[i]."""
    out = np.zeros((len(argmaxes), V), dtype=np.float32)
    for i, a in enumerate(argmaxes):
        out[i, a] = margin
    return out


def logp(probs):
    """Logits (log-probabilities) reproducing a distribution at temperature 1."""
    p = np.asarray(probs, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return np.log(p).astype(np.float32)


@pytest.mark.parametrize(
    "draft, target_argmax, n_accepted, tokens",
    [
        ([1, 2, 3], [1, 2, 3, 4], 3, [1, 2, 3, 4]),  # all accepted + bonus
        ([1, 2, 3], [1, 5, 3, 4], 1, [1, 5]),  # rejected at position 1: recovered token 5
        ([1, 2, 3], [0, 2, 3, 4], 0, [0]),  # rejected at once
        ([], [4], 0, [4]),  # empty draft: plain decoding
        ([2], [2, 2], 1, [2, 2]),  # repeated token
    ],
)
def test_greedy_table(draft, target_argmax, n_accepted, tokens):
    v = verify_greedy(draft, np.array(target_argmax))
    assert (v.n_accepted, v.tokens) == (n_accepted, tokens)
    # the same through verify() with logits
    v2 = verify(draft, None, logits_peaked(*target_argmax), GREEDY, np.random.default_rng(0))
    assert (v2.n_accepted, v2.tokens) == (n_accepted, tokens)


def test_sampled_accepts_when_draft_equals_target():
    # q == p: min(1, p/q) = 1, every draft token is accepted and a bonus is drawn from p
    p = np.array([0.1, 0.2, 0.3, 0.4, 0.0, 0.0])
    logits = np.stack([logp(p)] * 4)
    q = np.stack([process(logits[0], T1)] * 3)
    rng = np.random.default_rng(1)
    for _ in range(50):
        v = verify([3, 1, 2], q, logits, T1, rng)
        assert v.n_accepted == 3 and len(v.tokens) == 4 and v.tokens[3] in (0, 1, 2, 3)


def test_sampled_rejects_token_target_never_emits():
    # p(x) = 0 for the draft token: always rejected, recovered token drawn from p (never x)
    p = np.array([0.5, 0.5, 0.0, 0.0, 0.0, 0.0])
    logits = np.stack([logp(p)] * 2)
    q = np.zeros((1, V))
    q[0, 2] = 1.0
    rng = np.random.default_rng(2)
    seen = {verify([2], q, logits, T1, rng).tokens[0] for _ in range(200)}
    assert seen == {0, 1}


def test_sampled_acceptance_probability_is_min_one_p_over_q():
    # p(x) = 0.3, q(x) = 0.6: accept with probability 0.5; a deterministic draft (q = one-hot) with 0.3
    p = np.array([0.3, 0.7, 0, 0, 0, 0])
    logits = np.stack([logp(p)] * 2)
    q = np.array([[0.6, 0.4, 0, 0, 0, 0]])
    rng = np.random.default_rng(3)
    n = 20000
    rate_q = np.mean([verify([0], q, logits, T1, rng).n_accepted for _ in range(n)])
    rate_onehot = np.mean([verify([0], None, logits, T1, rng).n_accepted for _ in range(n)])
    rate_exact = np.mean([verify([0], q, logits, T1, rng, method="exact").n_accepted for _ in range(n)])
    assert abs(rate_q - 0.5) < 0.015
    assert abs(rate_onehot - 0.3) < 0.015
    assert abs(rate_exact - 0.3) < 0.015  # llama.cpp's rule accepts less


def test_sampled_output_distribution_is_the_targets():
    # first emitted token over many draws: must follow p whatever q is
    p = np.array([0.05, 0.15, 0.3, 0.5, 0.0, 0.0])
    q_row = np.array([0.4, 0.4, 0.1, 0.1, 0.0, 0.0])
    logits = np.stack([logp(p)] * 2)
    rng = np.random.default_rng(4)
    counts = np.zeros(V)
    n = 40000
    for _ in range(n):
        x = int(rng.choice(V, p=q_row))
        counts[verify([x], q_row[None], logits, T1, rng).tokens[0]] += 1
    tv = 0.5 * np.abs(counts / n - p).sum()
    assert tv < 0.01, (counts / n, p)


def test_residual_excludes_one_hot_draft_token():
    p = np.array([0.25, 0.25, 0.25, 0.25, 0, 0])
    logits = np.stack([logp(p)] * 2)
    rng = np.random.default_rng(5)
    rejected_outputs = {v.tokens[0] for v in (verify([0], None, logits, T1, rng) for _ in range(500)) if v.n_accepted == 0}
    assert rejected_outputs == {1, 2, 3}


def test_same_seed_same_result():
    logits = np.random.default_rng(0).normal(size=(5, V)).astype(np.float32)
    q = np.stack([process(logits[i] * 0.5, T1) for i in range(4)])
    a = [verify([1, 2, 3, 4], q, logits, T1, np.random.default_rng(7)).tokens for _ in range(3)]
    assert a[0] == a[1] == a[2]
