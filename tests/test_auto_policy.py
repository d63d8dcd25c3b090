"""AutoPolicy around the planner: the hybrid and the confidence stop through its choose/observe,
and a persisted profile planning a fresh controller's first step as the saved one's. No model."""
from __future__ import annotations

import pytest

from specserve import learned
from specserve.auto import Controller
from specserve.auto.acceptance import ConfidenceMap
from specserve.auto.cost import DraftCost
from specserve.config import SpecParams
from specserve.policy import Outcome
from test_controller import CPU_F16, GPU, SCENARIOS, simulate

NAMES = ["draft", "ngram", "suffix", "hybrid"]  # what an engine with a draft model offers auto


def measured(verify, draft_per_token: float, passes=(1, 2, 4, 8, 16, 33, 65)) -> Controller:
    """A controller that has measured `verify` and a draft model at `draft_per_token` seconds a token."""
    ctl = Controller()
    for _ in range(3):
        for n in passes:
            ctl.verify.add(n, verify(n))
    fit = ctl.draft["draft"] = DraftCost()
    for n, lag in [(1, 1), (4, 2), (8, 1), (2, 9), (6, 2), (3, 30)] * 5:
        fit.add(n, lag, draft_per_token * (1 + n + 0.4 * (lag - 1)))
    return ctl


def no_probes(policy) -> None:
    """Probing off: these tests are about the plan (a drafter never used would be probed at once)."""
    for name in policy.names:
        policy.ctl.interval[name] = 1 << 40


def teach(policy, drafter: str, steps: int, n: int, acc: int, offers=None) -> None:
    """Steps that drafted n tokens with `drafter` and kept acc, as observed outcomes."""
    from specserve.policy import Choice

    for _ in range(steps):
        for name, offer in (offers or {}).items():
            policy.see(name, offer)
        policy.choose()
        policy.observe(Outcome(Choice(drafter, n), n, acc, 0.001 * n, GPU(1 + n)))


def test_hybrid_when_the_match_is_short_and_the_draft_model_good():
    ctl = measured(GPU, 0.001)
    policy = ctl.policy(SpecParams(draft_max=8), NAMES)
    teach(policy, "draft", 30, 8, 8)  # the draft model: everything kept
    short = {"suffix": (8, 3), "ngram": (4, 3)}  # the suffix matched 8 tokens, 3 follow
    teach(policy, "suffix", 30, 3, 3, short)  # and what follows such matches is right
    for name, offer in short.items():
        policy.see(name, offer)
    name, plan = policy.plan()
    assert name == "hybrid" and plan.m == 3 and plan.k > 3
    no_probes(policy)
    c = policy.choose()
    assert (c.drafter, c.k) == ("hybrid", plan.k) and c.stop is not None
    # what it learns from a hybrid step: the suffix's 3 tokens and the model's after them
    before = policy.acc["draft"].tried[0]
    policy.observe(Outcome(c, c.k, c.k, 0.004, GPU(1 + c.k), [1.0] * 3 + [0.99] * (c.k - 3)))
    assert policy.acc["draft"].tried[0] > before and policy.lag["draft"] == 2
    # a match that fills the longest draft on its own: no hybrid (the model would never run)
    for name, offer in {"suffix": (16, 64), "ngram": (4, 64)}.items():
        policy.see(name, offer)
    assert policy.plan()[0] in ("suffix", "draft")


def test_no_hybrid_when_the_draft_model_is_dear():
    ctl = measured(CPU_F16, 0.013)  # a same-size draft on a CPU
    policy = ctl.policy(SpecParams(draft_max=8), NAMES)
    short = {"suffix": (8, 3), "ngram": (4, 3)}
    teach(policy, "suffix", 30, 3, 3, short)
    for name, offer in short.items():
        policy.see(name, offer)
    name, plan = policy.plan()
    assert (name, plan.k) == ("suffix", 3)
    no_probes(policy)
    assert policy.choose().stop is None  # no model: nothing to stop


def test_the_confidence_map_is_learnt_from_the_draft_models_steps():
    ctl = measured(GPU, 0.001)
    policy = ctl.policy(SpecParams(draft_max=8), ["draft"])
    from specserve.policy import Choice

    for _ in range(100):  # tokens drafted at 0.55 are rejected, at 0.98 kept
        policy.observe(Outcome(Choice("draft", 4), 4, 2, 0.004, GPU(5), [0.98, 0.98, 0.55, 0.98]))
    table = ctl.confidence_map("draft", 0.0).table()
    assert table[ConfidenceMap.bucket(0.55)] < 0.1 < 0.9 < table[ConfidenceMap.bucket(0.98)]
    stop = policy.choose().stop
    assert not stop(0, 0.98) and stop(1, 0.55)  # it stops at the token the map predicts rejected


@pytest.mark.parametrize("scenario", ["gpu_high", "cpu_q41_high", "cpu_ngram"])
def test_a_saved_profile_plans_the_first_step_as_the_saved_controller(tmp_path, scenario):
    target, draft = tmp_path / "t.gguf", tmp_path / "d.gguf"
    target.write_bytes(b"GGUF t" * 10)
    draft.write_bytes(b"GGUF d" * 10)
    store = learned.ProfileStore.for_models(str(target), str(draft), 2, directory=tmp_path / "auto")
    s = SCENARIOS[scenario]
    spec = SpecParams(draft_max=s.cap)
    trained = Controller(store)
    simulate(s, lambda: trained.policy(spec, s.names), seed=5)
    trained.save()
    fresh = Controller(learned.ProfileStore.for_models(str(target), str(draft), 2, directory=tmp_path / "auto"))
    assert fresh.load()
    trained.verify._table = None  # a table cached some passes ago may lag its estimates by up to 2%
    for offer in [(0, 0), (4, 8)]:  # with and without an n-gram match
        plans = []
        for ctl in (trained, fresh):
            policy = ctl.policy(spec, s.names)
            policy.see_ngram(*offer)
            name, plan = policy.plan()  # (probe pacing is of the moment: not kept, not compared)
            plans.append((name, plan.k, plan.rate))
        assert plans[1][:2] == plans[0][:2], (offer, plans)
        assert plans[1][2] == pytest.approx(plans[0][2], rel=0.05)
