"""Table tests for the verifier, from hand-made distributions (no model involved)."""
import numpy as np
import pytest

from specserve.config import SamplingParams, verify_method
from specserve.sampling import Sampler, candidates
from specserve.verifier import verify, verify_greedy

V = 6
GREEDY = SamplingParams(temperature=0.0)
T1 = SamplingParams(temperature=1.0)
METHODS = ("gumbel", "rejection")


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


def sampler(seed, method="rejection", params=T1):
    return Sampler(SamplingParams(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                                  seed=seed), method)


def q_rows(*rows):
    """One one-row q per draft position, from probability vectors."""
    return [candidates(logp(r), T1) for r in rows]


def draw_coupled(q, s: Sampler, pos):
    """The draft token a draft model with distribution q proposes at position pos (same noise as the target)."""
    return int(s.draw(candidates(logp(q), T1), pos)[0])


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
    # the same through verify() with logits, whatever the sampled method
    for method in METHODS:
        v2 = verify(draft, None, logits_peaked(*target_argmax), Sampler(GREEDY, method), 0)
        assert (v2.n_accepted, v2.tokens) == (n_accepted, tokens)


@pytest.mark.parametrize("method", METHODS)
def test_sampled_accepts_when_draft_equals_target(method):
    # q == p: rejection accepts with min(1, p/q) = 1; gumbel's coupled draft is the target's own draw
    p = [0.1, 0.2, 0.3, 0.4, 0.0, 0.0]
    logits = np.stack([logp(p)] * 4)
    for seed in range(50):
        s = sampler(seed, method)
        draft = [draw_coupled(p, s, pos) for pos in range(10, 13)]
        v = verify(draft, q_rows(p, p, p), logits, s, 10)
        assert v.n_accepted == 3 and len(v.tokens) == 4 and v.tokens[3] in (0, 1, 2, 3)


@pytest.mark.parametrize("method", METHODS)
def test_sampled_rejects_token_target_never_emits(method):
    # p(x) = 0 for the draft token: always rejected, the token emitted instead is drawn from p (never x)
    logits = np.stack([logp([0.5, 0.5, 0.0, 0.0, 0.0, 0.0])] * 2)
    seen = {verify([2], q_rows([0, 0, 1, 0, 0, 0]), logits, sampler(seed, method), 0).tokens[0] for seed in range(200)}
    assert seen == {0, 1}


def test_acceptance_probability():
    # p(x) = 0.3, q(x) = 0.6: rejection accepts with min(1, p/q) = 0.5, a deterministic draft (q = one-hot) with
    # p(x) = 0.3. Gumbel, with the draft drawn from q under the same noise: P(argmax(log p + G) = argmax(log q + G)),
    # for two outcomes 1 - TV = 0.7 (generally at least (1 - TV) / (1 + TV)), against rejection's 1 - TV = 0.7.
    p, q = [0.3, 0.7, 0, 0, 0, 0], [0.6, 0.4, 0, 0, 0, 0]
    logits = np.stack([logp(p)] * 2)
    n = 20000
    rate_q = np.mean([verify([0], q_rows(q), logits, sampler(i), 0).n_accepted for i in range(n)])
    rate_onehot = np.mean([verify([0], None, logits, sampler(i), 0).n_accepted for i in range(n)])
    rate_onehot_gumbel = np.mean([verify([0], None, logits, sampler(i, "gumbel"), 0).n_accepted for i in range(n)])
    rate_coupled = np.mean([verify([draw_coupled(q, s, 0)], q_rows(q), logits, s, 0).n_accepted
                            for s in (sampler(i, "gumbel") for i in range(n))])
    rate_rejection_drawn = np.mean([verify([draw_coupled(q, s, 0)], q_rows(q), logits, s, 0).n_accepted
                                    for s in (sampler(i) for i in range(n))])
    assert abs(rate_q - 0.5) < 0.015
    assert abs(rate_onehot - 0.3) < 0.015 and abs(rate_onehot_gumbel - 0.3) < 0.015
    assert abs(rate_coupled - 0.7) < 0.015 and abs(rate_rejection_drawn - 0.7) < 0.015


def test_auto_verifies_a_seeded_request_by_gumbel_and_an_unseeded_one_by_rejection():
    # Where the distributions differ over more than two tokens, gumbel's coupling keeps less of a draft model's
    # tokens than rejection's 1 - TV; a request without a seed has no text to keep, so auto (the default) takes
    # rejection there, and gumbel where the seed's text is promised.
    assert verify_method("auto", 7) == "gumbel" and verify_method("auto", None) == "rejection"
    assert verify_method("gumbel", None) == "gumbel" and verify_method("rejection", 7) == "rejection"
    with pytest.raises(ValueError, match="verify method"):
        verify_method("coupled", None)
    p, q = [0.4, 0.3, 0.2, 0.1, 0, 0], [0.1, 0.2, 0.3, 0.4, 0, 0]  # TV 0.4: rejection keeps 0.6
    logits = np.stack([logp(p)] * 2)

    def kept(make, n=20000):
        return np.mean([verify([draw_coupled(q, s, 0)], q_rows(q), logits, s, 0).n_accepted
                        for s in (make(i) for i in range(n))])
    unseeded = kept(lambda i: Sampler(T1))  # the default method, no seed: each sampler draws its own noise
    seeded = kept(lambda i: Sampler(SamplingParams(temperature=1.0, seed=i)))
    assert Sampler(T1).method == "rejection" and Sampler(SamplingParams(temperature=1.0, seed=1)).method == "gumbel"
    assert abs(unseeded - 0.6) < 0.015
    assert 0.6 / 1.4 - 0.015 < seeded < unseeded - 0.04  # (1 - TV) / (1 + TV) <= gumbel's, measurably below


@pytest.mark.parametrize("method", METHODS)
def test_sampled_output_distribution_is_the_targets(method):
    # the first emitted token over many seeds must follow p whatever q is
    p = np.array([0.05, 0.15, 0.3, 0.5, 0.0, 0.0])
    q = [0.4, 0.4, 0.1, 0.1, 0.0, 0.0]
    logits = np.stack([logp(p)] * 2)
    counts = np.zeros(V)
    n = 40000
    for seed in range(n):
        s = sampler(seed, method)
        counts[verify([draw_coupled(q, s, 7)], q_rows(q), logits, s, 7).tokens[0]] += 1
    tv = 0.5 * np.abs(counts / n - p).sum()
    assert tv < 0.01, (counts / n, p)


def test_gumbel_output_is_the_target_alones_whatever_the_draft():
    # the text for a seed does not depend on what was drafted: every token emitted is the target's own draw
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, V)).astype(np.float32) * 2
    for seed in range(200):
        s = sampler(seed, "gumbel")
        alone = [int(t) for t in s.pick(logits, 30)[0]]
        draft = [int(x) for x in rng.integers(0, V, size=4)]
        draft[: rng.integers(0, 5)] = alone[: 4]  # sometimes a correct prefix
        v = verify(draft[:4], None, logits, s, 30)
        assert v.tokens == alone[: v.n_accepted + 1]


def test_residual_excludes_one_hot_draft_token():
    logits = np.stack([logp([0.25, 0.25, 0.25, 0.25, 0, 0])] * 2)
    verdicts = [verify([0], None, logits, sampler(seed), 0) for seed in range(500)]
    assert {v.tokens[0] for v in verdicts if v.n_accepted == 0} == {1, 2, 3}


@pytest.mark.parametrize("method", METHODS)
def test_vocabularies_of_different_sizes(method):
    """A draft vocabulary padded beyond the target's, and the other way round: no broadcasting, no index errors."""
    p = [0.2, 0.2, 0.2, 0.2, 0.1, 0.1]  # the target's vocabulary: 6 tokens
    wide_q = [0.0, 0.0, 0.1, 0.1, 0.0, 0.0, 0.4, 0.4]  # the draft's: 8, most of its mass beyond the target's
    logits = np.stack([logp(p)] * 3)
    for seed in range(300):
        s = sampler(seed, method)
        x = draw_coupled(wide_q, s, 0)
        v = verify([x, 1], q_rows(wide_q, wide_q), logits[: 2 if x >= V else 3], s, 0)  # rows stop at x if invalid
        assert all(t < V for t in v.tokens[v.n_accepted:]) and (x < V or v.n_accepted == 0)
    narrow_q = [0.5, 0.5, 0.0, 0.0]  # the draft knows 4 tokens: q = 0 for the target's other 2
    wide_logits = np.stack([logp(p + [0.0, 0.0])] * 2)  # a target padded to 8
    counts = np.zeros(8)
    for seed in range(20000):
        s = sampler(seed, method)
        counts[verify([draw_coupled(narrow_q, s, 0)], q_rows(narrow_q), wide_logits, s, 0).tokens[0]] += 1
    assert 0.5 * np.abs(counts[:V] / counts.sum() - np.array(p)).sum() < 0.015


def test_same_seed_same_result():
    logits = np.random.default_rng(0).normal(size=(5, V)).astype(np.float32)
    q = [candidates(logits[i] * 0.5, T1) for i in range(4)]
    for method in METHODS:
        a = [verify([1, 2, 3, 4], q, logits, sampler(7, method), 0).tokens for _ in range(3)]
        assert a[0] == a[1] == a[2]


@pytest.mark.parametrize("method", METHODS)
def test_a_sampled_verdict_says_how_sure_the_target_was_where_it_judged(method):
    """Verdict.target_top: the target's top probability at rows 0..n_accepted (auto predicts the draft
    model's acceptance from it); none when greedy, whose argmax needs no distribution."""
    sure, unsure = [0.9, 0.1, 0.0, 0.0, 0.0, 0.0], [0.4, 0.3, 0.3, 0.0, 0.0, 0.0]
    logits = np.stack([logp(sure), logp(unsure), logp(sure)])
    s = sampler(3, method)
    v = verify([0, 5], q_rows(sure, unsure), logits, s, 0)  # 5: never the target's, rejected at row 1
    assert v.n_accepted <= 1 and len(v.target_top) == v.n_accepted + 1
    assert v.target_top == pytest.approx([0.9, 0.4][: v.n_accepted + 1], abs=1e-5)
    assert verify([0], None, logits_peaked(0, 1), Sampler(GREEDY, method), 0).target_top == ()
