"""The replay's workload sequence and its tokens/s per workload on a cost table, for auto and for each fixed
setting (tests/auto/test_gpu_costs.py). Run as a script, it prints both tables' comparison:

    PYTHONPATH=src python3 tests/auto/workloads.py

3 code edits, 3 coding questions, 3 stories at 0.8, then the 3 edits again, on one engine (3 seeds); each
fixed setting (the draft model and the n-gram at k in KS, the target alone) on an engine of its own.
"""
from __future__ import annotations

import numpy as np

from gpu_costs import RTX3090_14B, RTX3090_CATCHUP, RTX3090_DRAFT_TOK
from replay import REFERENCE, Replay, Text, code_edit, question, story
from step_simulator import curve
from specserve.auto import Controller
from specserve.config import SpecParams
from specserve.policy import FixedPolicy

WORKLOADS = ("edit", "question", "story", "repeat")
KS = (2, 4, 6, 8, 12, 16)
SEEDS = range(3)
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


RTX3090 = dict(verify=RTX3090_14B, draft_tok=RTX3090_DRAFT_TOK, catchup=RTX3090_CATCHUP)
CPU = dict(verify=REFERENCE, draft_tok=0.038, catchup=0.005)  # the reference pair on this CPU (replay.py)
# the same pair through `specserve serve` on 2026-12-07 (SPECSERVE_LOG=debug, the bench's edits and questions:
# median seconds of the passes and drafts it ran): plain passes twice as fast as REFERENCE's, so a pass over
# 2 tokens costs 1.7 plain ones (1.07 in REFERENCE) and a drafted token a quarter of a plain pass
CPU_SERVED = dict(verify=curve({1: 83, 2: 144, 3: 149, 4: 162, 6: 177, 7: 222, 9: 247, 17: 359, 29: 561,
                                56: 1071}), draft_tok=0.022, catchup=0.0055)


def speeds(make_ctl, costs=RTX3090, skip: int = 0) -> dict[str, float]:
    """Tokens per second of each workload (its tokens over its seconds), over the seeds; the first `skip`
    requests of each engine run but are not counted."""
    tokens, seconds = dict.fromkeys(WORKLOADS, 0.0), dict.fromkeys(WORKLOADS, 0.0)
    for seed in SEEDS:
        replay = Replay(make_ctl(), seed=seed, **costs)
        for i, (work, text) in enumerate(sequence(seed)):
            run = replay.run(text, SpecParams())
            if i >= skip:
                tokens[work] += sum(s.accepted + 1 for s in run.steps)
                seconds[work] += run.seconds
    return {w: tokens[w] / seconds[w] for w in WORKLOADS}


def fixed_speeds(costs=RTX3090, skip: int = 0) -> dict[str, dict[str, float]]:
    """`speeds` of every fixed setting: "none", "draft k", "ngram k"."""
    fixed = {"none": speeds(lambda: Fixed(None, 0), costs, skip)}
    for k in KS:
        fixed[f"draft {k}"] = speeds(lambda: Fixed("draft", k), costs, skip)
        fixed[f"ngram {k}"] = speeds(lambda: Fixed("ngram", k), costs, skip)
    return fixed


def best_fixed(fixed: dict[str, dict[str, float]], work: str) -> str:
    return max(fixed, key=lambda name: fixed[name][work])


if __name__ == "__main__":
    for label, costs in (("reference pair, CPU", CPU), ("RTX 3090", RTX3090), ("reference pair, served", CPU_SERVED)):
        auto, fixed = speeds(Controller, costs), fixed_speeds(costs)
        for work in WORKLOADS:
            best = best_fixed(fixed, work)
            print(f"{label}: {work}: auto {auto[work]:.2f} tok/s, best fixed {best} {fixed[best][work]:.2f}, "
                  f"{auto[work] / fixed[best][work]:.3f}x")
