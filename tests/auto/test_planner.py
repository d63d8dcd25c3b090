"""The planner alone: synthetic cost curves and acceptance in, (drafter, k) out. No model, no clock."""
from __future__ import annotations

import pytest

from specserve.auto import planner
from specserve.auto.acceptance import ConfidenceMap
from specserve.auto.planner import ConfidenceStop, Option, best_length, plan, step_costs


def table(ms: dict[int, float], n_max: int = 66) -> list[float]:
    """[n_max + 1] seconds of a target pass over n tokens, linear between the points given (ms)
    and with the last slope beyond them; index 0 unused."""
    ns = sorted(ms)
    out = [0.0]
    for n in range(1, n_max + 1):
        j = next((i for i, x in enumerate(ns) if x >= n), len(ns) - 1)
        a, b = (ns[j - 1], ns[j]) if j > 0 else (ns[0], ns[1])
        out.append((ms[a] + (ms[b] - ms[a]) * (n - a) / (b - a)) / 1000)
    return out


# as tests/auto/step_simulator.py: SmolLM2-135M on the project's CPU, and a memory-bound GPU
CPU_F16 = table({1: 19, 2: 23, 4: 28, 8: 37, 16: 61})
CPU_Q41 = table({1: 13, 2: 19, 4: 30, 8: 51, 16: 97})
GPU = table({1: 20.0, 64: 26.3})
FREE = (0.0, 0.0, 0.0)  # a lookup: drafting costs nothing


def lookup(name: str, acc: float, available: int, cap: int = 64) -> Option:
    """A lookup whose match offers `available` tokens, each accepted with `acc` given the ones before."""
    return Option(name, [acc] * cap, FREE, min(cap, available), found=True)


def model(acc: float, per_token: float, cap: int = 8, head: tuple = ()) -> Option:
    """A draft model at `per_token` seconds a token (its first evaluation as dear), accepted with `acc`."""
    return Option("hybrid" if head else "draft", [acc] * cap, (per_token, per_token, 0.4 * per_token), cap,
                  head=head)


def test_the_textbook_formula_when_every_token_is_returned():
    """E[tokens] = 1 + sum_j prod_{i<=j} a_i; seconds = verify(k + 1) + draft(k); k maximises their ratio."""
    acc = [0.9, 0.8, 0.5, 0.2]
    o = Option("draft", acc, (0.001, 0.002, 0.0), 4, found=True)
    V = CPU_F16
    rates = {}
    for k in range(1, 5):
        chain, e = 1.0, 1.0
        for a in acc[:k]:
            chain *= a
            e += chain
        rates[k] = (e / (V[k + 1] + 0.001 + 0.002 * k), e)
    k = max(rates, key=lambda k: rates[k][0])
    p = best_length(o, V)
    assert (p.k, p.rate, p.tokens) == (k, pytest.approx(rates[k][0]), pytest.approx(rates[k][1]))


def test_long_matches_at_high_acceptance_draft_long():
    name, p = plan(GPU, [lookup("suffix", 0.97, 60)])
    assert name == "suffix" and p.k >= 40  # far past --draft-max's 8: a pass of 60 costs ~1.3 of one
    _, cpu = plan(CPU_F16, [lookup("suffix", 0.97, 60)])
    assert 8 < cpu.k < p.k  # a CPU's pass grows with its tokens: shorter, still long
    _, short = plan(GPU, [lookup("suffix", 0.97, 5)])
    assert short.k == 5  # never past what the match has


def test_draft_length_follows_acceptance():
    ks = [plan(GPU, [lookup("ngram", a, 64)])[1].k for a in (0.5, 0.8, 0.95)]
    assert ks[0] < ks[1] < ks[2]


def test_no_speculation_when_nothing_pays():
    # hot prose at temperature 0.8: lookups rarely right, the draft model at 30%, on a CPU
    options = [lookup("ngram", 0.15, 8), lookup("suffix", 0.2, 12), model(0.3, 0.006)]
    name, p = plan(CPU_F16, options)
    assert (name, p.k) == (None, 0) and p.rate == pytest.approx(1 / CPU_F16[1])
    # a steep verify curve (Q4_1 on a CPU) and a 13 ms draft: even 97% acceptance cannot pay
    assert plan(CPU_Q41, [model(0.97, 0.013)])[0] is None
    # the same draft on a flat GPU curve with a cheap draft pays
    assert plan(GPU, [model(0.97, 0.001)])[0] == "draft"


def test_steeper_verify_curves_draft_shorter():
    o = lookup("suffix", 0.9, 64)
    assert plan(CPU_Q41, [o])[1].k < plan(CPU_F16, [o])[1].k < plan(GPU, [o])[1].k


def test_catch_up_counts_against_a_drafter():
    o = model(0.8, 0.001)._replace(catchup=0.5)  # a cold cache: half a second to catch up
    assert planner.pick(GPU, [("draft", best_length(o, GPU), 0.5)], horizon=10)[0] is None
    assert planner.pick(GPU, [("draft", best_length(o, GPU), 0.5)], horizon=10_000)[0] == "draft"


def test_a_step_is_chosen_by_what_it_makes_against_the_requests_rate():
    """The reference pair's CPU at a copy's break: a 3-token draft-model step, 38 ms a token and the n-gram's
    25 tokens to catch up on (5 ms each, the step's own), makes 3.4 tokens in 0.49 s: 7 tok/s, above a plain
    step's 6. Judged by its own rate it wins; where the request runs at 20 tok/s (the n-gram resumes after
    the break), its 0.32 s more than a plain step's would make 6.5 tokens there: the plain step wins."""
    V = table({1: 165, 2: 176, 3: 190, 4: 200, 6: 225, 9: 283, 17: 450})
    o = model(0.9, 0.038)._replace(kmin=3, kmax=3)
    p = best_length(o, V)
    owed = 0.005 * 25
    assert p.k == 3 and p.tokens / (p.seconds + owed) > 1 / V[1]
    assert planner.pick(V, [("draft", p, 0.0, owed)], horizon=100)[0] == "draft"  # the step's rate alone
    assert planner.pick(V, [("draft", p, 0.0, owed)], horizon=100, value=20.0)[0] is None
    # at plain decoding's rate the two rules agree
    assert planner.pick(V, [("draft", p, 0.0, owed)], horizon=100, value=1 / V[1])[0] == "draft"
    assert planner.worth(10, 0.5, V) == 20.0 and planner.worth(1, 1.0, V) == 1 / V[1]
    assert planner.worth(0, 0.0, V) is None


def test_hybrid_chosen_only_when_it_pays():
    head = (0.95,) * 3  # a suffix match of 3 tokens, nearly always right
    # GPU, cheap draft at 80%: the lookup's 3 tokens, then the model beyond them
    options = [lookup("suffix", 0.95, 3), model(0.8, 0.001), model(0.8, 0.001, head=head)]
    name, p = plan(GPU, options)
    assert name == "hybrid" and p.m == 3 and p.k > 3
    # the lookup's tokens wrong: the model's would only count after them
    bad = (0.1,) * 3
    name, _ = plan(GPU, [lookup("suffix", 0.1, 3), model(0.8, 0.001), model(0.8, 0.001, head=bad)])
    assert name == "draft"
    # a CPU and a 13 ms draft: the model never pays, the lookup alone does
    name, p = plan(CPU_F16, [lookup("suffix", 0.95, 3), model(0.8, 0.013), model(0.8, 0.013, head=head)])
    assert (name, p.k) == ("suffix", 3)


def test_confidence_stop_at_the_token_the_map_predicts_rejected():
    m = ConfidenceMap()
    for _ in range(200):  # learnt: at top probability 0.98 a token is kept, at 0.55 it is not
        m.add([0.98, 0.55], 1)
    acceptance = m.table()
    assert acceptance[ConfidenceMap.bucket(0.55)] < 0.2 and acceptance[ConfidenceMap.bucket(0.98)] > 0.9
    costs = step_costs(GPU, 0.001, 0, 8)  # 1 ms a draft token + what each adds to the pass

    def stopped_at(probs, acc=acceptance):
        stop = ConfidenceStop(acc, ConfidenceMap.EDGES, costs, tokens=1.0, seconds=0.001 + GPU[1])
        return next((i for i, p in enumerate(probs) if stop(i, p)), len(probs))

    probs = [0.99, 0.97, 0.98, 0.55, 0.99, 0.99]
    assert stopped_at(probs) == 3  # the learnt map: the 0.55 token predicts a rejection
    assert stopped_at(probs, ConfidenceMap().table()) == len(probs)  # calibrated prior: 0.55 still pays on a GPU
    assert stopped_at([0.99] * 8) == 8  # confident all the way: up to the cap
    # by hand, at the token it stops: gain chain * a(p) per its seconds below the rate so far
    stop = ConfidenceStop(acceptance, ConfidenceMap.EDGES, costs, 1.0, 0.001 + GPU[1])
    assert not any(stop(i, p) for i, p in enumerate(probs[:3]))
    gain = stop.chain * acceptance[ConfidenceMap.bucket(0.55)]
    assert gain / costs[3] < stop.tokens / stop.seconds and stop(3, 0.55)


def test_the_stop_weighs_a_plans_last_token_by_its_share_of_the_pass():
    """The draft model never evaluates the last token a plan allows, so keeping it costs its share
    of the pass alone: at a 2-token plan's last token the stop keeps a token that it declines
    where drafting goes on (the reference pair: draft tokens 45 ms, 3x a token's share of the pass)."""
    V, b = table({1: 220, 2: 230, 3: 245, 5: 280, 9: 350}), 0.045
    assert step_costs(V, b, 0, 2) == (pytest.approx(b + V[2] - V[1]), pytest.approx(V[3] - V[2]))

    def stops(k: int) -> list[bool]:
        stop = ConfidenceStop(ConfidenceMap().table(), ConfidenceMap.EDGES, step_costs(V, b, 0, k), 1.0, b + V[1])
        return [stop(0, 0.97), stop(1, 0.3)]

    assert stops(2) == [False, False] and stops(8) == [False, True]


def test_confidence_stop_keeps_draft_min():
    costs = step_costs(CPU_Q41, 0.013, 0, 8)  # every token dear: stop at once, but for --draft-min
    stop = ConfidenceStop(ConfidenceMap().table(), ConfidenceMap.EDGES, costs, 1.0, 0.013 + CPU_Q41[1], kmin=2)
    assert [stop(i, 0.3) for i in range(3)] == [False, False, True]


def test_the_stop_looks_past_a_step_in_the_pass_cost():
    """A pass that grows by steps: on this CPU the reference pair's target passes over 1-3 tokens
    cost 70/105/113 ms, over 4-7 about 152. The 4th token then costs 39 ms of pass and the next three
    nearly nothing; judged alone, the 4th stops every confident draft at 3, though 7 pay more."""
    V, b = table({1: 70, 2: 105, 3: 113, 4: 150, 7: 153, 8: 190, 16: 300}), 0.017
    k = 6
    costs = step_costs(V, b, 0, k)
    acceptance = ConfidenceMap().table()  # calibrated: top probability 0.97 -> kept 97% of the time

    def drafted(p: float) -> int:
        stop = ConfidenceStop(acceptance, ConfidenceMap.EDGES, costs, 1.0, b + V[1])
        return next((i for i in range(k) if stop(i, p)), k)

    assert drafted(0.97) == k  # past the step: tokens 4-6 share its cost
    # the rate of the whole draft beats the one cut before the step, as the plan says
    a = acceptance[ConfidenceMap.bucket(0.97)]
    tokens = [1 + sum(a ** j for j in range(1, n + 1)) for n in range(k + 1)]
    seconds = [b + V[1] + sum(costs[:n]) for n in range(k + 1)]
    assert tokens[k] / seconds[k] > tokens[2] / seconds[2]
    assert drafted(0.45) < 2  # a doubtful token: no run after it pays
