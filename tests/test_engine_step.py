"""The engine's step through its interfaces: a new drafter plugs in by name alone, a policy hears
every drafter's offer, and the stats count what was committed."""
from __future__ import annotations

from specserve.config import SamplingParams, SpecParams
from specserve.drafters import BaseDrafter, Draft, Offer
from specserve.engine import Engine, Slot
from specserve.policy import Choice, FixedPolicy, tell_offers


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
    monkeypatch.setattr(Slot, "_drafters", lambda self, spec: {"repeat": repeat})
    engine = Engine(target, None, n_ctx=256)
    policy = Listening("repeat", 3)
    monkeypatch.setattr(engine, "policy_for", lambda spec, temperature=0.0: policy)
    slot = engine.new_slot()
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    g = slot.generate("a a a a a a", params, SpecParams(mode="auto"))
    monkeypatch.undo()
    alone = Engine(target, None, n_ctx=256).new_slot().generate("a a a a a a", params, SpecParams(mode="none"))
    assert g.tokens == alone.tokens
    assert g.stats.drafter_steps.get("repeat") and len(repeat.kept) == g.stats.drafter_steps["repeat"]
    assert policy.offers and all(o == ("repeat", (1, 1000)) for o in policy.offers)


def test_offers_reach_the_first_controllers_shape():
    class Old:
        sees_ngram = True

        def __init__(self):
            self.seen = []

        def see_ngram(self, order, available):
            self.seen.append((order, available))

    old = Old()
    tell_offers(old, {"ngram": Offer(3, 7), "suffix": Offer(5, 9)})
    assert old.seen == [(3, 7)]
    assert Choice("ngram", 2).k == 2


def test_stats_count_committed_tokens(tiny_models):
    slot = Engine(tiny_models["target"], tiny_models["draft_close"], n_ctx=256).new_slot()
    g = slot.generate("the cat sat on the mat", SamplingParams(max_tokens=30, ignore_eos=True),
                      SpecParams(mode="draft", draft_max=4))
    s = g.stats
    assert len(g.tokens) == s.n_generated == 30 == s.n_passes + s.n_accepted
    assert 0 < s.t_forward < s.t_total and 0 <= s.t_python < s.t_decode
