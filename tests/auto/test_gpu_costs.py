"""`--spec auto` on a GPU's costs: the seed's pair on an RTX 3090 (gpu_costs.py, from published llama.cpp
figures), replayed (replay.py: the real lookups and store, auto's real policy, a modelled draft model) over
the replay's workloads: code edits, coding questions, stories at 0.8, then the edits again (repeats).

Against every fixed setting a user could pick instead: the draft model at k in {2, 4, 6, 8, 12, 16}, the
n-gram at the same k, the target alone; each setting on the same request sequence, on an engine of its own.
Auto runs as a server's request does (SpecParams(): the draft model up to 8, lookups up to 64).
"""
from __future__ import annotations

import numpy as np
import pytest

from gpu_costs import RTX3090_14B, RTX3090_CATCHUP, RTX3090_DRAFT_TOK
from replay import Replay, Text, code_edit, question, story
from specserve.auto import Controller
from specserve.config import SpecParams
from specserve.policy import FixedPolicy

WORKLOADS = ("edit", "question", "story", "repeat")
KS = (2, 4, 6, 8, 12, 16)
SEEDS = range(3)
# auto's tokens/s at least (1 - tolerance) x the best fixed setting's, per workload. Code edits: a known
# gap (docs/auto.md, "On a GPU's costs"): a fixed n-gram of 12-24 beats auto by about a fifth there, on the
# CPU's costs too; held here so that it does not widen, and as a strict xfail at 5% below
TOLERANCE = {"edit": 0.25, "question": 0.05, "story": 0.05, "repeat": 0.05}


class Fixed:
    """A controller that hands every request the same fixed policy (what `--spec draft|ngram|none` does)."""

    def __init__(self, drafter: str | None, k: int):
        self.drafter, self.k = drafter, k

    def policy(self, spec, names, temperature=0.0, prompt=None) -> FixedPolicy:
        return FixedPolicy(self.drafter, self.k)


def sequence(seed: int) -> list[tuple[str, Text]]:
    """3 code edits, 3 coding questions, 3 stories at 0.8, then the 3 edits again, on one engine."""
    rng = np.random.default_rng(seed)
    edits = [code_edit(rng) for _ in range(3)]
    return ([("edit", t) for t in edits] + [("question", question(rng)) for _ in range(3)]
            + [("story", story(rng)) for _ in range(3)] + [("repeat", t) for t in edits])


def speeds(make_ctl) -> dict[str, float]:
    """Tokens per second of each workload (its tokens over its seconds), over the seeds."""
    tokens, seconds = dict.fromkeys(WORKLOADS, 0.0), dict.fromkeys(WORKLOADS, 0.0)
    for seed in SEEDS:
        replay = Replay(make_ctl(), verify=RTX3090_14B, draft_tok=RTX3090_DRAFT_TOK, catchup=RTX3090_CATCHUP,
                        seed=seed)
        for work, text in sequence(seed):
            run = replay.run(text, SpecParams())
            tokens[work] += sum(s.accepted + 1 for s in run.steps)
            seconds[work] += run.seconds
    return {w: tokens[w] / seconds[w] for w in WORKLOADS}


@pytest.fixture(scope="module")
def results() -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    fixed = {"none": speeds(lambda: Fixed(None, 0))}
    for k in KS:
        fixed[f"draft {k}"] = speeds(lambda: Fixed("draft", k))
        fixed[f"ngram {k}"] = speeds(lambda: Fixed("ngram", k))
    return speeds(Controller), fixed


def best_fixed(fixed: dict[str, dict[str, float]], work: str) -> str:
    return max(fixed, key=lambda name: fixed[name][work])


@pytest.mark.parametrize("work", WORKLOADS)
def test_auto_is_at_least_the_best_fixed_setting_on_a_3090s_costs(results, work):
    auto, fixed = results
    best = best_fixed(fixed, work)
    print(f"{work}: auto {auto[work]:.1f} tok/s, best fixed {best} {fixed[best][work]:.1f}, target alone "
          f"{fixed['none'][work]:.1f}: {auto[work] / fixed[best][work]:.3f}x best")
    assert auto[work] >= (1 - TOLERANCE[work]) * fixed[best][work]
    assert auto[work] >= fixed["none"][work]


@pytest.mark.xfail(strict=True, reason="code edits: a fixed n-gram of 12 beats auto by about a fifth (docs/auto.md)")
def test_auto_is_within_5_percent_of_the_best_fixed_setting_on_code_edits(results):
    auto, fixed = results
    assert auto["edit"] >= 0.95 * fixed[best_fixed(fixed, "edit")]["edit"]


def test_the_3090s_passes_are_not_flat():
    """The published figures: a pass over 9 tokens costs about 2.2 passes over one, over 17 about 2.8 (not ~1x,
    as a purely memory-bound pass would): the tables auto plans from on a GPU are of this shape."""
    one = RTX3090_14B(1)
    assert 0.0120 < one < 0.0128  # 81 tok/s for the 14B Q4_K_M
    assert 2.0 < RTX3090_14B(9) / one < 2.4 and 2.6 < RTX3090_14B(17) / one < 3.0
    assert all(RTX3090_14B(n + 1) > RTX3090_14B(n) for n in range(1, 65))
