"""An answer that copies a span of its prompt, then writes new text: once the copy has ended (no lookup
matches for a few steps), what a second of the request is worth is what it makes since, not the copy's rate.
Priced at the copy's rate, the draft model's catch-up on the copied tokens looked too dear for plain steps to
give way to it, and grew with each plain step: through `specserve serve` with a profile learnt on code edits, a
coding answer that copied 18 tokens of its question ran 90 of its 128 tokens as plain steps (11.9 s against 9.3).
"""
from __future__ import annotations

import numpy as np
import pytest

from replay import HEADER, SYSTEM, Replay, Text
from specserve.auto import Controller
from specserve.auto.request_state import PLAIN_RUN
from specserve.config import SpecParams
from workloads import CPU, RTX3090


def copy_then_write(seed: int, span: int = 64) -> Text:
    """A question quoting `span` tokens that the answer starts by copying, then 104 new tokens the draft model
    keeps 9 in 10 of (a coding answer that restates the given code, then writes its own)."""
    rng = np.random.default_rng(seed)
    quoted = rng.integers(0, 300, span).tolist()
    prompt = SYSTEM + rng.integers(0, 1000, 20).tolist() + quoted + rng.integers(0, 1000, 10).tolist() + HEADER
    return Text(prompt, quoted + rng.integers(1000, 2000, 104).tolist(), 0.9)


@pytest.mark.parametrize("costs", ["cpu", "3090"])
@pytest.mark.parametrize("seed", range(3))
def test_after_the_copy_the_draft_model_takes_over_for_good(costs, seed):
    run = Replay(Controller(), seed=seed, **{"cpu": CPU, "3090": RTX3090}[costs]).run(copy_then_write(seed),
                                                                                     SpecParams())
    steps = [s.drafter for s in run.steps]
    copied = [i for i, s in enumerate(run.steps) if s.drafter in ("ngram", "suffix") and s.accepted]
    after = steps[copied[-1] + 1:-1]  # after the copy; (the last step makes the last token: nothing to draft)
    print(costs, seed, f"{run.tokens_per_s:.2f} tok/s:", " ".join(d or "-" for d in steps))
    # a few plain steps wait for the copy to resume; then the draft model runs (before, plain runs came back
    # between its steps: 7 plain steps after the copy in 4 of these 6)
    assert after.count(None) <= PLAIN_RUN + 1
