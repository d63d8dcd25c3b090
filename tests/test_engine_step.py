"""The engine's step through its interfaces: a new drafter plugs in by name alone, a policy hears
every drafter's offer, and the stats count what was committed."""
from __future__ import annotations

from specserve.config import SamplingParams, SpecParams
from specserve.drafters import BaseDrafter, Draft, Offer
from specserve.engine import Engine
from specserve.policy import FixedPolicy, judge, tell_offers, wants_offers


class Repeat(BaseDrafter):
    """Proposes the last token again and again: a drafter the engine has never heard of."""

    name = "repeat"

    def __init__(self):
        self.kept = []

    def peek(self, seq):
        return Offer(1, 1_000)

    def propose(self, seq, k, sampler):
        return Draft([seq[-1]] * k)

    def accepted(self, n):
        self.kept.append(n)


class Listening(FixedPolicy):
    sees_offers = True

    def __init__(self, drafter, k):
        super().__init__(drafter, k)
        self.offers = []

    def see(self, drafter, offer):
        self.offers.append((drafter, tuple(offer)))


def test_a_new_drafter_plugs_in_by_name(tiny_models, monkeypatch):
    target = tiny_models["target"]
    repeat = Repeat()
    engine = Engine(target, None, n_ctx=256, drafters=lambda slot, spec, constraint: {"repeat": repeat})
    policy = Listening("repeat", 3)
    monkeypatch.setattr(engine, "policy_for", lambda spec, temperature=0.0, grammar=False, prompt=None: policy)
    slot = engine.new_slot()
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    g = slot.generate("a a a a a a", params, SpecParams(mode="auto"))
    monkeypatch.undo()
    alone = Engine(target, None, n_ctx=256).new_slot().generate("a a a a a a", params, SpecParams(mode="none"))
    assert g.tokens == alone.tokens
    assert g.stats.drafter_steps.get("repeat") and len(repeat.kept) == g.stats.drafter_steps["repeat"]
    assert policy.offers and all(o == ("repeat", (1, 1000)) for o in policy.offers)


class Echo(Repeat):
    """Another lookup-like drafter: proposes the last token, then 7, 7, ..."""

    name = "echo"

    def propose(self, seq, k, sampler):
        return Draft([seq[-1]] + [7] * (k - 1))


def test_drafters_that_did_not_draft_are_judged_against_what_was_committed(tiny_models, monkeypatch):
    """Outcome.shadow: each matching drafter but the one that drafted, judged as verification would have."""
    target = tiny_models["target"]
    engine = Engine(target, None, n_ctx=256,
                    drafters=lambda slot, spec, constraint: {"repeat": Repeat(), "echo": Echo()})
    policy = Listening("repeat", 3)
    outcomes = []
    policy.observe = outcomes.append
    monkeypatch.setattr(engine, "policy_for", lambda spec, temperature=0.0, grammar=False, prompt=None: policy)
    g = engine.new_slot().generate("a a a a a a", SamplingParams(max_tokens=20, ignore_eos=True),
                                   SpecParams(mode="auto"))
    done = 0
    for o in outcomes:
        committed = g.tokens[done : done + o.n_accepted + 1]
        drafted = {o.choice.drafter} if o.choice.k else set()  # judged by verification itself
        assert set(o.shadow) == {"repeat", "echo"} - drafted
        if done:  # echo proposed [the last token, 7, 7, ...]
            assert o.shadow["echo"] == judge([g.tokens[done - 1]] + [7] * 63, committed)
        done += len(committed)
    assert done == len(g.tokens) == 20 and any(o.choice.k for o in outcomes)


def test_judging_a_draft_stops_at_its_first_wrong_token():
    assert judge([1, 2, 3], [1, 2, 9, 4]) == (3, 2)  # the third was judged and wrong
    assert judge([1, 2, 3], [1, 2, 3, 4]) == (3, 3)  # all right; the fourth position was not drafted
    assert judge([1, 2, 3, 4], [1, 2]) == (2, 2)  # the rest was never judged: the step committed 2
    assert judge([5], [1]) == (1, 0) and judge([], [1]) == (0, 0)


def test_offers_reach_only_a_policy_that_wants_them():
    class Seeing:
        def __init__(self, sees: bool):
            self.sees_offers, self.seen = sees, []

        def see(self, name, offer):
            self.seen.append((name, tuple(offer)))

    seeing, blind = Seeing(True), Seeing(False)
    for policy in (seeing, blind):
        tell_offers(policy, {"ngram": Offer(3, 7), "suffix": Offer(5, 9)})
    assert seeing.seen == [("ngram", (3, 7)), ("suffix", (5, 9))] and blind.seen == []
    assert wants_offers(seeing) and not wants_offers(blind) and not wants_offers(FixedPolicy("ngram", 4))


def test_stats_count_committed_tokens(tiny_models):
    slot = Engine(tiny_models["target"], tiny_models["draft_close"], n_ctx=256).new_slot()
    g = slot.generate("the cat sat on the mat", SamplingParams(max_tokens=30, ignore_eos=True),
                      SpecParams(mode="draft", draft_max=4))
    s = g.stats
    assert len(g.tokens) == s.n_generated == 30 == s.n_passes + s.n_accepted
    assert 0 < s.t_forward < s.t_total and 0 <= s.t_python < s.t_decode
