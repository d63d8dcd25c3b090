"""`--spec auto` on a GPU's costs: the seed's pair on an RTX 3090 (gpu_costs.py, from published llama.cpp
figures), replayed (replay.py: the real lookups and store, auto's real policy, a modelled draft model) over
the replay's workloads: code edits, coding questions, stories at 0.8, then the edits again (repeats).

Against every fixed setting a user could pick instead: the draft model at k in {2, 4, 6, 8, 12, 16}, the
n-gram at the same k, the target alone; each setting on the same request sequence, on an engine of its own.
Auto runs as a server's request does (SpecParams(): the draft model up to 8, lookups up to 64).
"""
from __future__ import annotations

import pytest

from gpu_costs import RTX3090_14B
from specserve.auto import Controller
from workloads import CPU, RTX3090, WORKLOADS, Fixed, best_fixed, fixed_speeds, speeds

# auto's tokens/s at least (1 - tolerance) x the best fixed setting's, per workload. Code edits: a known
# gap (docs/auto.md, "On a GPU's costs"): a fixed n-gram of 12 beats auto by 6% there (a fifth before auto
# chose by opportunity cost), all of it in a fresh engine's first edit; held here so that it does not widen,
# and as a strict xfail at 5% below
TOLERANCE = {"edit": 0.10, "question": 0.05, "story": 0.05, "repeat": 0.05}


@pytest.fixture(scope="module")
def results() -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    return speeds(Controller), fixed_speeds()


@pytest.mark.parametrize("work", WORKLOADS)
def test_auto_is_at_least_the_best_fixed_setting_on_a_3090s_costs(results, work):
    auto, fixed = results
    best = best_fixed(fixed, work)
    print(f"{work}: auto {auto[work]:.1f} tok/s, best fixed {best} {fixed[best][work]:.1f}, target alone "
          f"{fixed['none'][work]:.1f}: {auto[work] / fixed[best][work]:.3f}x best")
    assert auto[work] >= (1 - TOLERANCE[work]) * fixed[best][work]
    assert auto[work] >= fixed["none"][work]


@pytest.mark.xfail(strict=True, reason="code edits: a fixed n-gram of 12 beats auto by 6%, all in a fresh engine's "
                                       "first edit (docs/auto.md)")
def test_auto_is_within_5_percent_of_the_best_fixed_setting_on_code_edits(results):
    auto, fixed = results
    assert auto["edit"] >= 0.95 * fixed[best_fixed(fixed, "edit")]["edit"]


@pytest.mark.parametrize("costs", ["cpu", "3090"])
def test_code_edits_after_an_engines_first_request_are_as_fast_as_the_best_n_gram(costs):
    """Once the engine has run one request (the first edit: what it knows of the draft model, the kind's
    rate, the lookups' share), the other two edits run at least 0.95x a fixed n-gram of 12 on both tables.
    Before auto chose steps by opportunity cost: 0.82x on the CPU (the draft model took each edit's
    206-token prompt, 1 s of a 6 s edit, to draft at the copies' breaks, with the copies' tokens to catch up
    on each time), 0.84x on the 3090; now 1.00x and 1.06x. A fresh engine's first edit is still 0.74x
    (CPU) and 0.76x (3090): the draft model is tried there before anything shows the lookups will copy."""
    table = {"cpu": CPU, "3090": RTX3090}[costs]
    auto = speeds(Controller, table, skip=1)["edit"]
    ngram = speeds(lambda: Fixed("ngram", 12), table, skip=1)["edit"]
    print(f"{costs}: edits after the first, auto {auto:.2f} tok/s, n-gram 12 {ngram:.2f}: {auto / ngram:.3f}x")
    assert auto >= 0.95 * ngram


def test_the_3090s_passes_are_not_flat():
    """The published figures: a pass over 9 tokens costs about 2.2 passes over one, over 17 about 2.8 (not ~1x,
    as a purely memory-bound pass would): the tables auto plans from on a GPU are of this shape."""
    one = RTX3090_14B(1)
    assert 0.0120 < one < 0.0128  # 81 tok/s for the 14B Q4_K_M
    assert 2.0 < RTX3090_14B(9) / one < 2.4 and 2.6 < RTX3090_14B(17) / one < 3.0
    assert all(RTX3090_14B(n + 1) > RTX3090_14B(n) for n in range(1, 65))
