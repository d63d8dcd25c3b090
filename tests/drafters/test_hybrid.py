"""The hybrid drafter (a lookup's match, then the draft model) and the draft model's stopping rule,
on the tiny models the suite writes: drafts as specified, and speculation with them lossless."""
from __future__ import annotations

import pytest

from specserve.config import SamplingParams, SpecParams
from specserve.drafters import BaseDrafter
from specserve.drafters.draft_model import DraftModelDrafter
from specserve.drafters.hybrid import HybridDrafter
from specserve.drafters.ngram import NgramDrafter
from specserve.engine import Engine, standard_drafters
from specserve.policy import FixedPolicy
from specserve.sampling import Sampler
from lossless_checks import EPS_TINY, assert_greedy_equal, chi_square_pvalue, exact_first_two, repeating_prompt

GREEDY = SamplingParams(max_tokens=40, ignore_eos=True)


class FirstOnly(BaseDrafter):
    """A lookup that proposes at most `n` tokens of prompt lookup's match: short heads on demand."""

    name = "ngram"

    def __init__(self, n: int):
        self.ngram, self.n = NgramDrafter(), n

    def propose(self, seq, k, sampler=None):
        return self.ngram.propose(seq, min(k, self.n), sampler)


@pytest.fixture
def engine(tiny_models):
    return Engine(tiny_models["target"], tiny_models["draft_close"], n_ctx=256)


def draft_model(engine) -> DraftModelDrafter:
    return DraftModelDrafter(engine.draft, engine.draft.new_context(256))


def test_a_stop_rule_ends_the_draft_and_sees_the_top_probability(engine):
    seq = engine.target.tokenize("the cat sat on the mat")
    d, seen = draft_model(engine), []

    def stop(i, p):
        seen.append((i, p))
        return i == 2

    draft = d.propose(seq, 6, Sampler(GREEDY), stop=stop)
    assert len(draft) == 2 and [i for i, _ in seen] == [0, 1, 2]
    assert draft.confidence == [p for _, p in seen[:2]] and all(0 < p <= 1 for _, p in seen)
    again = d.propose(seq, 2, Sampler(GREEDY))  # no rule: drafts k, as before
    assert again.tokens == draft.tokens and again.confidence is None
    d.ctx.close()


def test_a_sampled_drafts_confidence_is_its_most_likely_tokens_probability(engine):
    """At a temperature with no top-k, top-p or min-p every token is a candidate, in id order: the
    stop rule and the confidence map must see the largest probability, not the first candidate's."""
    seq = engine.target.tokenize("the cat sat on the mat")
    d, seen = draft_model(engine), []
    draft = d.propose(seq, 4, Sampler(SamplingParams(temperature=0.8, seed=3)),
                      stop=lambda i, p: seen.append(p) or False)
    assert len(draft) == len(seen) == len(draft.confidence) > 0
    for p, q, x in zip(seen, draft.dists, draft.tokens):
        assert list(q.ids[0, :3]) == [0, 1, 2]  # untruncated: in id order
        assert p == pytest.approx(float(q.probs.max())) and p >= q.prob(0, x)
    d.ctx.close()


def test_hybrid_drafts_the_match_then_the_model_after_it(engine):
    slot = engine.new_slot()
    seq = repeating_prompt(engine, slot)
    ngram, model = NgramDrafter(), draft_model(engine)
    order, available = ngram.peek(seq)
    assert order and available > 2
    head = ngram.propose(seq, 2).tokens
    hybrid = HybridDrafter([FirstOnly(2)], model)
    draft = hybrid.propose(seq, 5, Sampler(GREEDY), stop=lambda i, p: False)
    alone = draft_model(engine)  # the model on its own, asked after seq + the lookup's tokens
    assert draft.tokens == head + alone.propose(seq + head, 3, Sampler(GREEDY)).tokens
    assert len(draft.confidence) == len(draft) and draft.confidence[:2] == [1.0, 1.0]
    assert model._view == seq  # the lookup's tokens were not taken for committed ones
    # sampled: one q per token, one-hot for the lookup's
    sampled = hybrid.propose(seq, 5, Sampler(SamplingParams(temperature=0.8, seed=1), "rejection"))
    assert len(sampled.dists) == len(sampled) and sampled.dists[0].prob(0, sampled.tokens[0]) == 1.0
    # no match: nothing
    assert HybridDrafter([NgramDrafter(n_min=4, n_max=4)], model).propose(seq[:5], 5, Sampler(GREEDY)).tokens == []
    for d in (model, alone):
        d.ctx.close()
    slot.close()


def hybrid_engine(engine, monkeypatch, head: int, k: int) -> None:
    """Every request drafts with the hybrid: `head` lookup tokens at most, then the model, k in all."""
    def drafters(slot, spec, constraint):
        out = standard_drafters(slot, spec, constraint)
        out["hybrid"] = HybridDrafter([FirstOnly(head)], out["draft"])
        return out

    engine.make_drafters = drafters
    monkeypatch.setattr(engine, "policy_for",
                        lambda spec, temperature=0.0, grammar=False, prompt=None: FixedPolicy("hybrid", k))


def test_greedy_hybrid_equals_target_alone(engine, monkeypatch, tiny_models):
    target, slot = tiny_models["target"], engine.new_slot()
    prompt = repeating_prompt(engine, slot)
    reference = slot.generate(prompt, GREEDY, SpecParams(mode="none")).tokens
    hybrid_engine(engine, monkeypatch, head=2, k=6)
    g = slot.generate(prompt, GREEDY, SpecParams(mode="auto"))
    assert_greedy_equal(target, prompt, reference, g.tokens, EPS_TINY, "hybrid")
    assert g.stats.drafter_steps.get("hybrid") and g.stats.n_drafted > 2 * g.stats.drafter_steps["hybrid"]
    slot.close()


@pytest.mark.parametrize("method", ["rejection", "gumbel"])
def test_sampled_hybrid_matches_target_distribution(engine, monkeypatch, tiny_models, method):
    """One lookup token (q one-hot) then one model token (its q) in one draft: still the target's distribution."""
    target, slot = tiny_models["target"], engine.new_slot()
    prompt = repeating_prompt(engine, slot)
    sampling = dict(temperature=0.8)
    expected = exact_first_two(target, prompt, SamplingParams(max_tokens=3, **sampling))
    hybrid_engine(engine, monkeypatch, head=1, k=2)
    n_runs, counts, drafted, accepted = 1500, {}, 0, 0
    for seed in range(n_runs):
        g = slot.generate(prompt, SamplingParams(max_tokens=3, seed=seed, ignore_eos=True, **sampling),
                          SpecParams(mode="auto"), method)
        key = (g.tokens[0], g.tokens[1])
        counts[key] = counts.get(key, 0) + 1
        drafted += g.stats.n_drafted
        accepted += g.stats.n_accepted
    slot.close()
    assert drafted >= 1.5 * n_runs and 0 < accepted < drafted
    p = chi_square_pvalue(counts, expected, n_runs)
    assert p > 1e-3, f"distribution differs from the target's (chi-square p = {p:.2e})"


def test_auto_plans_the_hybrid_on_real_models(engine):
    """The engine offers the hybrid to auto; a generation with it stays the target's (greedy)."""
    assert engine.drafter_names == ["draft", "ngram", "suffix", "hybrid"]
    policy = engine.policy_for(SpecParams())
    assert policy.hybrid and "hybrid" not in policy.names
    slot = engine.new_slot()
    assert set(slot.drafters(SpecParams())) == set(engine.drafter_names)
    slot.close()
