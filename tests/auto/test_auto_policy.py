"""AutoPolicy around the planner: the hybrid and the confidence stop through its choose/observe,
and a persisted profile planning a fresh controller's first step as the saved one's. No model."""
from __future__ import annotations

import pytest

from specserve import learned
from specserve.auto import Controller
from specserve.auto.acceptance import ConfidenceMap
from specserve.config import SpecParams
from specserve.policy import Outcome
from policies import NAMES, measured, no_probes
from step_simulator import CPU_F16, GPU, SCENARIOS, simulate

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
    # the draft model in step with the text (those 30 steps left it 120 tokens behind, a catch-up that the
    # step which runs it pays)
    policy.lags.lag["draft"] = 2
    for name, offer in short.items():
        policy.see(name, offer)
    name, plan = policy.plan()
    assert name == "hybrid" and plan.m == 3 and plan.k > 3
    no_probes(policy)
    c = policy.choose()
    assert (c.drafter, c.k) == ("hybrid", plan.k) and c.stop is not None
    # what it learns from a hybrid step: the suffix's 3 tokens and the model's after them
    before = policy.est.acc["draft"].tried[0]
    policy.observe(Outcome(c, c.k, c.k, 0.004, GPU(1 + c.k), [1.0] * 3 + [0.99] * (c.k - 3)))
    assert policy.est.acc["draft"].tried[0] > before and policy.lags.lag["draft"] == 2
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


def test_lookups_are_learnt_from_the_steps_they_did_not_draft():
    """Outcome.shadow: a request whose n-gram matches keep failing learns it at the steps the
    draft model drafts, instead of paying a pass per failed n-gram step (here: the probes a
    blind policy sends); a lookup judged that way is never probed."""
    def run(shadow: bool):
        ctl = measured(CPU_F16, 0.008)  # a dear draft model: a pass of the n-gram is a real choice
        policy = ctl.policy(SpecParams(draft_max=8), ["draft", "ngram"])
        offer, failed = (2, 40), 0  # a 2-token match, 40 tokens follow; its proposal is always wrong
        for step in range(40):  # the draft model keeps all it drafts, then (a harder passage) nothing
            kept = 4 if step < 20 else 0
            policy.see("ngram", offer)
            c = policy.choose()
            if c.drafter == "ngram":
                failed += 1
                policy.observe(Outcome(c, c.k, 0, 0.0, CPU_F16(1 + c.k)))
            else:
                policy.observe(Outcome(c, c.k, min(kept, c.k), 0.008 * c.k, CPU_F16(1 + c.k),
                                       shadow={"ngram": (1, 0)} if shadow else None))
        return policy, failed

    policy, failed = run(shadow=True)
    _, failed_blind = run(shadow=False)
    assert failed < failed_blind, (failed, failed_blind)
    assert policy.est.by_match[("ngram", 2)].t > 10  # judged at the draft model's steps too
    ctl = policy.ctl
    assert "ngram" in ctl.pacing.shadowed and policy.probes.due("ngram", ctl.costs.verify.table(9), 1.0) is None
    # a hybrid step's lookup was judged by verification itself: its shadow entry is not counted twice
    before = policy.est.by_match[("ngram", 2)].t
    policy.learner.shadow({"ngram": (1, 0)}, "hybrid", ("ngram", 2, 3), {"ngram": (2, 3)}, policy.progress.generated)
    assert policy.est.by_match[("ngram", 2)].t == before


def test_a_lookups_match_at_the_first_step_is_learnt_apart():
    """At a request's first step a match ends in the prompt's last tokens (the template's header):
    the suffix drafter then proposes an earlier answer's opening. Its acceptance there is its own."""
    from specserve.auto.acceptance import OPENING
    from specserve.policy import Choice

    ctl = measured(CPU_F16, 0.008)
    spec = SpecParams(draft_max=8)
    offer = {"suffix": (4, 8)}
    for _ in range(3):  # earlier requests: within an answer a 4-token match held; at the opening, never
        policy = ctl.policy(spec, ["suffix"])
        teach(policy, "suffix", 1, 2, 0, offer)
        teach(policy, "suffix", 12, 2, 2, offer)
        policy.finish()
    rate = {b: ctl.prior("suffix", b)[0] / ctl.prior("suffix", b)[1] for b in (OPENING, 4)}
    assert rate[OPENING] < 0.2 and rate[4] > 0.7, rate
    policy = ctl.policy(spec, ["suffix"])
    policy.see("suffix", offer["suffix"])
    assert policy.plan()[0] is None  # the opening: plain decoding
    policy.choose()
    policy.observe(Outcome(Choice(None, 0), 0, 0, 0.0, CPU_F16(1)))
    policy.see("suffix", offer["suffix"])
    assert policy.plan()[0] == "suffix"  # the same match within the answer: drafted


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
    trained.costs.verify.refit()  # a table cached some passes ago may lag its estimates by up to 2%
    for offer in [(0, 0), (4, 8)]:  # with and without an n-gram match
        plans = []
        for ctl in (trained, fresh):
            policy = ctl.policy(spec, s.names)
            policy.see("ngram", offer)
            name, plan = policy.plan()  # (probe pacing is of the moment: not kept, not compared)
            plans.append((name, plan.k, plan.rate))
        assert plans[1][:2] == plans[0][:2], (offer, plans)
        assert plans[1][2] == pytest.approx(plans[0][2], rel=0.05)


def test_spread_weighs_the_pooled_rate_by_how_alike_requests_were():
    """Requests whose rates only scatter binomially around the pooled rate make it worth many trials;
    requests far from it (code, then translation, then code) make it worth few."""
    from specserve.auto.acceptance import PRIOR_W, W_MAX, W_MIN, Spread

    alike, unlike = Spread(), Spread()
    assert alike.weight(0.7) == PRIOR_W  # nothing seen yet: the fixed weight
    for i in range(12):
        alike.add(0.7 + (0.05 if i % 2 else -0.05), 0.7, 20)  # within 20 trials' binomial noise (0.10)
        unlike.add(0.9 if i % 2 else 0.1, 0.5, 20)
    assert alike.weight(0.7) == W_MAX
    assert unlike.weight(0.5) == W_MIN
    middling = Spread()
    for i in range(12):
        middling.add(0.7 + (0.2 if i % 2 else -0.2), 0.7, 20)  # variance 0.04 - 0.0105 of noise
    assert W_MIN < middling.weight(0.7) < PRIOR_W
    assert middling.weight(0.7) == pytest.approx(0.21 / (0.04 - 0.0105) - 1, rel=0.05)


def test_a_request_unlike_the_last_ones_leans_less_on_their_rate():
    """Lookups accepted in code (all kept) and rejected in translations (none kept), alternately:
    a new request that has seen its first 2 suffix drafts rejected trusts the pooled rate less than
    the fixed weight would (that is, before the engine knew how much requests differ)."""
    from specserve.auto.acceptance import PRIOR_W

    ctl = measured(CPU_F16, 0.02)
    offers = {"suffix": (8, 6), "ngram": (0, 0)}

    def request(kept: bool, steps: int = 6):
        policy = ctl.policy(SpecParams(draft_max=8), NAMES)
        no_probes(policy)
        teach(policy, "suffix", steps, 6, 6 if kept else 0, offers)
        policy.finish()

    def after_two_misses() -> tuple[float, float]:
        """(its first position's rate, the same with the fixed weight)"""
        policy = ctl.policy(SpecParams(draft_max=8), NAMES)
        no_probes(policy)
        teach(policy, "suffix", 3, 6, 0, offers)  # (the first step's match is the opening's: learnt apart)
        p = ctl.prior("suffix", 8, 0.0)
        shape = ctl.position_shape("suffix", 8, 0.0).factors(policy.caps["suffix"])
        return (policy.est.lookup("suffix", 8)[0],
                policy.est.by_match[("suffix", 8)].rates(p[0] / p[1], PRIOR_W, shape)[0])

    request(True)
    now, fixed = after_two_misses()  # (not finished: it tells the spread nothing)
    assert now == fixed  # one request seen: the fixed weight
    for i in range(9):
        request(i % 2 == 0)  # ... the last one kept all, as the first did
    assert ctl.priors.spread[("suffix", 8, 0.0)].n > 3
    now, fixed = after_two_misses()
    assert fixed > 0.3 and now < 0.7 * fixed  # (the first position: a copy that breaks, breaks there)


def test_the_spread_and_the_shape_are_kept_in_a_saved_profile():
    ctl = measured(GPU, 0.001)
    for i in range(5):
        ctl.learn_spread("suffix", 8, 0.0, 0.9 if i % 2 else 0.1, 12.0)
        ctl.position_shape("suffix", 8, 0.0).add([[1, 0, 2, 4, 8, 0, 0], [2, 1, 2, 4, 8, 0, 0]])
    fresh = Controller()
    fresh.load_state_dict(ctl.state_dict())
    assert fresh.prior_weight("suffix", 8, 0.0, 0.5) == ctl.prior_weight("suffix", 8, 0.0, 0.5)
    # the shape too, at its full weight: how drafts break is the pair's and the work's, not the machine's
    assert fresh.position_shape("suffix", 8, 0.0).factors(16) == ctl.position_shape("suffix", 8, 0.0).factors(16)
    assert ctl.position_shape("suffix", 8, 0.0).factors(16)[0] < 0.8
    state = ctl.state_dict()
    del state["spread"], state["shape"]  # a profile written before the spread and the shape were kept
    older = Controller()
    older.load_state_dict(state)
    assert older.priors.spread == {} and older.priors.shape == {}


def test_a_pooled_rate_thinned_by_reloads_falls_back_toward_the_drafters_prior():
    """Each load halves the pooled counts a process does not refresh; a regime unused for a few
    processes must not keep the ratio of its last few trials as if it were known."""
    ctl = measured(GPU, 0.001)
    ctl.priors.pooled[("draft", 0, 0.75)] = [0.21, 1.28, 4.35, 4.39]  # 16% kept, of about one trial
    ctl.priors.pooled[("draft", 0, 0.0)] = [62.0, 66.0, 72.0, 78.0]  # well measured: 94%
    ctl.priors.pooled[("ngram", 4, 0.0)] = [0.1, 1.0, 1.0, 1.0]
    fresh = Controller()
    fresh.load_state_dict(ctl.state_dict())
    hot = fresh.prior("draft", 0, 0.75)
    assert hot[1] == pytest.approx(2.0) and 0.5 < hot[0] / hot[1] < 0.7  # mostly the prior's 0.7
    assert fresh.prior("draft", 0, 0.0) == pytest.approx([31.0, 33.0, 36.0, 39.0])  # halved, nothing added
    lookup = fresh.prior("ngram", 4, 0.0)
    assert lookup[:2] == pytest.approx([0.05 + 1.5 * 0.6, 2.0])  # a lookup's prior: 2 trials at its bucket's 0.6
    assert Controller().prior("draft", 0, 0.75) == pytest.approx([5.6, 8.0, 8.0, 8.0])  # unknown: the prior alone


def test_what_a_process_leaves_untouched_is_saved_as_it_was_loaded():
    """A load scales the saved evidence down, for the process's own to outweigh; what no request
    of the process touched must not shrink at every load and save. Ten processes of one greedy
    request each (`specserve generate`): the draft model at 0.8 keeps the 40 trials, the
    confidence maps and the lookups' share it was saved with; at 0 it learns as before."""
    ctl = measured(GPU, 0.001)
    ctl.priors.pooled[("draft", 0, 0.75)] = [27.0, 40.0, 54.0, 64.0]
    ctl.priors.pooled[("draft", 0, 0.0)] = [62.0, 66.0, 72.0, 78.0]
    for _ in range(30):
        ctl.confidence_map("draft", 0.75).add([0.9, 0.8, 0.3], 2)
        ctl.target_map("draft", 0.75).add([0.95, 0.6], 1)
    ctl.learn_lookup_share(0.75, 10.0, 64)
    saved = state = ctl.state_dict()
    for _ in range(10):
        process = Controller()
        process.load_state_dict(state)
        policy = process.policy(SpecParams(draft_max=8), ["draft"])
        no_probes(policy)
        teach(policy, "draft", 5, 4, 4)
        policy.finish()
        state = process.state_dict()
    fresh = Controller()
    fresh.load_state_dict(state)
    assert fresh.prior("draft", 0, 0.75) == pytest.approx([13.5, 20.0, 27.0, 32.0])  # halved once, as at any load
    for section in ("draft_confidence", "target_confidence", "lookup_share"):
        hot = [e for e in state[section] if 0.75 in e[:2]]
        assert hot and hot == [e for e in saved[section] if 0.75 in e[:2]]
    used = fresh.prior("draft", 0, 0.0)
    assert used[0] / used[1] > 0.95 and used[1] < 40.0  # what the processes drafted, halved at each load as before


def test_what_a_process_learns_of_a_drafters_cost_is_saved():
    """A drafting cost the process touched is saved as it learnt it, not as it was loaded (a state
    kept to tell the untouched from the touched must be a copy, not the live regression)."""
    loaded = Controller()
    loaded.load_state_dict(measured(GPU, 0.001).state_dict())
    before = loaded.state_dict()["draft_cost"]["draft"]
    policy = loaded.policy(SpecParams(draft_max=8), ["draft"])
    no_probes(policy)
    teach(policy, "draft", 20, 4, 4)
    policy.finish()
    saved = loaded.state_dict()["draft_cost"]["draft"]
    assert saved == loaded.costs.draft["draft"].state() != before


def test_requests_far_apart_leave_a_draft_models_prior_little_weight():
    """Code at 95% and prose at 30% in turn: the pooled rate says little about the next request, for
    the draft model as for a lookup, so a prose request stops drafting after a few tokens."""
    from specserve.auto.acceptance import PRIOR_W, W_MIN

    ctl = Controller()
    assert ctl.prior_weight("draft", 0, 0.0, 0.7) == PRIOR_W  # nothing known of requests yet
    for i in range(8):
        ctl.learn_spread("draft", 0, 0.0, 0.95 if i % 2 else 0.3, 20.0)
        ctl.learn_spread("ngram", 0, 0.0, 0.95 if i % 2 else 0.3, 20.0)
    assert ctl.prior_weight("draft", 0, 0.0, 0.7) == W_MIN
    assert ctl.prior_weight("ngram", 0, 0.0, 0.7) == W_MIN


def test_the_draft_models_first_draft_is_learnt_apart():
    """The pair open their answers differently, so a request's first draft fails where the next ones
    hold: it neither counts against the request's rate nor moves the pooled one; its own is learnt."""
    from specserve.auto.acceptance import OPENING

    ctl = measured(GPU, 0.002)
    policy = ctl.policy(SpecParams(mode="auto", draft_max=8), ["draft"])
    no_probes(policy)
    pooled = list(ctl.prior("draft", 0, 0.0))
    teach(policy, "draft", 1, 4, 0)  # the first step: nothing kept
    assert policy.est.acc["draft"].t == 0 and ctl.prior("draft", 0, 0.0)[:2] == pooled[:2]
    assert ctl.prior("draft", OPENING, 0.0)[1] > ctl.prior("draft", OPENING, 0.0)[0] + 0.9  # a failed trial
    teach(policy, "draft", 1, 4, 4)  # the next: all kept, counted as usual
    assert policy.est.acc["draft"].t > 0 and ctl.prior("draft", 0, 0.0)[0] > 0.98 * pooled[0] + 3.9


def test_each_step_is_traced_at_debug_level(caplog):
    """SPECSERVE_LOG=debug: one line a step, with what was planned and what ran."""
    ctl = measured(GPU, 0.002)
    policy = ctl.policy(SpecParams(mode="auto", draft_max=8), NAMES, temperature=0.8)
    no_probes(policy)
    with caplog.at_level("DEBUG", logger="specserve.auto"):
        teach(policy, "draft", 3, 4, 2)
    lines = [r.getMessage() for r in caplog.records if r.name == "specserve.auto"]
    assert len(lines) == 3
    assert lines[0].startswith("step 1 T0.75: planned ") and "ran draft k=4 drafted 4 accepted 2" in lines[0]
    assert "acceptance so far draft:" in lines[2]
    caplog.clear()
    with caplog.at_level("DEBUG", logger="specserve.auto"):  # a lookup's step says what it matched
        teach(policy, "ngram", 1, 6, 6, {"ngram": (5, 6), "suffix": (0, 0)})
    line = [r.getMessage() for r in caplog.records if r.name == "specserve.auto"][0]
    assert "(match 5, 6 available)" in line and "ran ngram k=6" in line, line
    caplog.clear()
    with caplog.at_level("INFO", logger="specserve.auto"):
        teach(policy, "draft", 2, 4, 2)
    assert not [r for r in caplog.records if r.name == "specserve.auto"]


def test_a_lookup_whose_copies_hold_or_break_at_once_is_planned_by_position():
    """A lookup's 16-token drafts either hold to the end or break at their first token, one of each
    in turn, as copies in a code edit do. Pooled over every judged token it keeps 16 in 17, which
    would plan a 4-token draft for 4.1 tokens a step; its first token is kept 1 time in 2. The
    engine's Shape learns that over finished requests, so a new request's plan expects what
    its drafts deliver, 1 + k/2 tokens, at every length drafted before."""
    ctl = measured(CPU_F16, 0.02)
    offer = {"suffix": (16, 64)}

    def request(pairs: int):
        policy = ctl.policy(SpecParams(draft_max=8), ["suffix"])
        no_probes(policy)
        teach(policy, "suffix", 1, 1, 0, offer)  # (the opening: learnt apart)
        for _ in range(pairs):
            teach(policy, "suffix", 1, 16, 16, offer)
            teach(policy, "suffix", 1, 16, 0, offer)
        return policy

    for _ in range(8):
        request(5).finish()
    rates = request(1).est.lookup("suffix", 16)
    for k in (1, 4, 16):
        tokens, chain = 1.0, 1.0
        for x in rates[:k]:
            chain *= x
            tokens += chain
        assert tokens == pytest.approx(1 + k / 2, rel=0.05), (k, rates[:4])


def worth_a_prefill() -> tuple[Controller, SpecParams]:
    """A draft model that keeps 90% of its tokens after 16 answers of 64 tokens: a 50-token prompt's
    catch-up (4 ms a token) pays."""
    ctl = measured(CPU_F16, 0.006)
    ctl.priors.pooled[("draft", 0, 0.0)] = [18.0, 20.0, 20.0, 20.0]
    ctl.costs.prompt_cost["draft"] = 0.004
    for n in [64] * 16:
        ctl.learn_length(n)
    return ctl, SpecParams(draft_max=8)


def test_a_prefill_is_judged_over_the_shorter_answers_seen():
    """A draft model that keeps 90% of its tokens, a 50-token prompt to catch up on: worth it over
    64-token answers, not where over a quarter of recent answers ended after 15 tokens (translations
    among code): a short answer would pay the whole catch-up, and the model can still start mid-
    answer. The lengths are kept in the profile."""
    ctl, spec = worth_a_prefill()
    assert ctl.policy(spec, ["draft"]).prefill("draft", 50, 64)
    for n in [15] * 6:
        ctl.learn_length(n)
    policy = ctl.policy(spec, ["draft"])
    assert policy.prefills.prefill_horizon() == 15 and not policy.prefill("draft", 50, 64)
    fresh = Controller()
    fresh.load_state_dict(ctl.state_dict())
    assert fresh.history.lengths == ctl.history.lengths == [64] * 16 + [15] * 6


def test_a_thinly_known_pooled_rate_is_judged_as_the_estimate_it_is():
    """A pooled rate of 60% near break-even, where requests have been alike (the spread worth 40
    trials): backed by 40 trials, a prompt's catch-up is declined; backed by the 3 trials a regime
    keeps after reloads and one failed draft, the rate itself is that unsure, and the draft model
    takes the prompt to learn what this regime keeps (else it never drafts there again)."""
    from specserve.auto.acceptance import Spread

    def prefills(trials: float) -> bool:
        ctl, spec = worth_a_prefill()
        ctl.costs.prompt_cost["draft"] = 0.0004  # 20 ms for the 50-token prompt
        ctl.priors.pooled[("draft", 0, 0.75)] = [0.6 * trials, trials, trials, trials]
        alike = ctl.priors.spread[("draft", 0, 0.75)] = Spread()
        for _ in range(10):
            alike.add(0.6, 0.6, 20.0)
        assert ctl.prior_weight("draft", 0, 0.75, 0.6) == 40.0
        return ctl.policy(spec, ["draft"], temperature=0.8).prefill("draft", 50, 64)

    assert not prefills(40.0)
    assert prefills(3.0)


def test_the_draft_models_acceptance_is_predicted_from_how_sure_the_target_was():
    """At 0.8 the draft model keeps its tokens where the target was sure of its own and loses them
    where it was not: a new request whose first plain steps show an unsure target plans the draft
    model at the lower rate before it has drafted (and does not draft), one whose target was sure
    at the higher rate (and drafts). The map is learnt from the draft model's judged tokens."""
    from specserve.policy import OFF, Choice

    ctl = measured(CPU_F16, 0.004)  # a draft model at 0.4 of a target pass, as on a CPU
    for sure in (True, False):  # a request where the target was sure (all 4 kept), one where it was not
        teacher = ctl.policy(SpecParams(mode="auto", draft_max=8), ["draft"], temperature=0.8)
        no_probes(teacher)
        teacher.choose()  # the opening draft: judged apart, not mapped
        teacher.observe(Outcome(Choice("draft", 4), 4, 0, 0.008, CPU_F16(5), None, None, [0.97]))
        for _ in range(20):
            teacher.choose()
            teacher.observe(Outcome(Choice("draft", 4), 4, 4 if sure else 0, 0.008, CPU_F16(5), None, None,
                                    [0.97] * 5 if sure else [0.3]))
        teacher.finish()
    table = ctl.target_map("draft", 0.75).table()
    assert table[ConfidenceMap.bucket(0.3)] < 0.15 and table[ConfidenceMap.bucket(0.97)] > 0.95
    pooled = ctl.prior("draft", 0, 0.75)
    assert 0.6 < pooled[0] / pooled[1] < 0.9  # the pooled rate alone says the same of both requests

    def request(top: float):
        policy = ctl.policy(SpecParams(mode="auto", draft_max=8), ["draft"], temperature=0.8)
        no_probes(policy)
        for _ in range(3):  # plain steps: how sure the target was of each token
            policy.choose()
            policy.observe(Outcome(OFF, 0, 0, 0.0, CPU_F16(1), None, None, [top]))
        return policy, policy.est.rates("draft", 0, policy.est.acc["draft"])[0]

    unsure, unsure_rate = request(0.3)
    sure, sure_rate = request(0.97)
    assert unsure_rate < 0.5 < 0.9 < sure_rate
    assert unsure.plan()[0] is None and sure.plan()[0] == "draft"
    # kept in a saved profile, like the draft's own confidence map
    fresh = Controller()
    fresh.load_state_dict(ctl.state_dict())
    assert fresh.target_map("draft", 0.75).table()[ConfidenceMap.bucket(0.97)] > 0.9


def test_a_prefill_is_judged_over_the_tokens_the_lookups_leave():
    """A draft model's prompt catch-up is repaid only by the tokens it drafts. Where the lookups
    copied most of the recent answers (a summary, a code edit), the same catch-up that pays over
    64 plain-decoded tokens does not pay over the few they leave; what they kept counts, and so
    does what they would have kept where the draft model drafted (their shadow). The share is
    kept in the profile, and a request's own steps move it."""
    from specserve.policy import Choice

    ctl, spec = worth_a_prefill()
    names = ["draft", "ngram"]
    assert ctl.policy(spec, names).prefill("draft", 50, 64)
    for _ in range(3):  # answers the n-gram copied: it keeps 8 of 9 tokens, or would have (shadow)
        policy = ctl.policy(spec, names)
        no_probes(policy)
        for step in range(8):
            policy.see("ngram", (8, 40))
            policy.choose()
            if step % 2:
                policy.observe(Outcome(Choice("ngram", 8), 8, 8, 0.0, CPU_F16(9)))
            else:
                policy.observe(Outcome(Choice("draft", 8), 8, 8, 0.048, CPU_F16(9), shadow={"ngram": (9, 8)}))
        assert policy.progress.covered == 8 * 8 and policy.progress.generated == 8 * 9
        policy.finish()
    assert ctl.share_of_lookups(0.0) == pytest.approx(8 / 9)
    policy = ctl.policy(spec, names)
    assert policy.prefills.uncovered() == pytest.approx(1 / 9) and not policy.prefill("draft", 50, 64)
    # without lookups, nothing changes
    assert ctl.policy(spec, ["draft"]).prefill("draft", 50, 64)
    # a request whose own lookups fail leans back toward the draft model as it goes
    no_probes(policy)
    for _ in range(8):
        policy.choose()
        policy.observe(Outcome(Choice("draft", 4), 4, 4, 0.024, CPU_F16(5), shadow={"ngram": (1, 0)}))
    assert policy.prefills.uncovered() > 0.6
    fresh = Controller()
    fresh.load_state_dict(ctl.state_dict())
    assert fresh.share_of_lookups(0.0) == pytest.approx(8 / 9)


def test_a_shadow_longer_than_the_lookups_cap_is_judged_up_to_the_cap():
    """With --draft-max 8 the lookups are capped at 8 too, yet a draft model step that keeps 8
    commits 9 tokens, and the engine judges a matching lookup against all 9 (Outcome.shadow).
    Through the server that raised IndexError inside the policy and cancelled the request."""
    from specserve.policy import Choice

    ctl = measured(CPU_F16, 0.008)
    spec = SpecParams(draft_max=8, suffix_max=8)  # what `--draft-max 8` makes (config.draft_max_caps_suffix)
    policy = ctl.policy(spec, ["draft", "ngram", "suffix"])
    no_probes(policy)
    policy.choose()
    policy.observe(Outcome(Choice("draft", 0), 0, 0, 0.0, CPU_F16(1)))  # past the opening step
    policy.see("ngram", (4, 40))
    policy.see("suffix", (8, 8))
    policy.choose()
    policy.observe(Outcome(Choice("draft", 8), 8, 8, 0.048, CPU_F16(9), shadow={"ngram": (9, 9), "suffix": (9, 7)}))
    assert policy.est.acc["ngram"].h == pytest.approx(8) and policy.est.acc["ngram"].t == pytest.approx(8)
    assert policy.est.acc["suffix"].h == pytest.approx(7) and policy.est.acc["suffix"].t == pytest.approx(8)


def test_the_forced_run_is_always_taken_and_not_credited_to_the_drafter():
    """Under a grammar, auto drafts the forced run whatever it plans (a fresh controller's plain
    first step included), the chosen drafter's k on top of it; and what it learns of the drafter
    is its own tokens after the run: 4 forced and kept, then 4 of the draft model's all rejected
    is a draft model that kept 0 of 1, not 4 of 5."""
    from specserve.policy import Choice

    fresh = Controller().policy(SpecParams(draft_max=8), [*NAMES, "grammar"])
    fresh.see("grammar", (3, 3))
    c = fresh.choose()
    assert (c.drafter, c.k) == ("grammar", 3)  # not plain decoding
    ctl = measured(GPU, 0.001)
    policy = ctl.policy(SpecParams(draft_max=8), [*NAMES, "grammar"])
    no_probes(policy)
    teach(policy, "draft", 30, 8, 8)
    policy.see("grammar", (4, 4))
    c = policy.choose()
    assert c.drafter == "draft" and c.k > 4
    before = policy.est.acc["draft"].h, policy.est.acc["draft"].t
    policy.observe(Outcome(Choice("draft", 8), 8, 4, 0.004, GPU(9), forced=4))
    g = 0.95  # acceptance._G_POOL: a request's pooled counts decay each step
    assert (policy.est.acc["draft"].h, policy.est.acc["draft"].t) == pytest.approx((g * before[0], g * before[1] + 1))
