"""--cache-reuse on the draft model's cache: after the prompt lost its first lines, the draft model
evaluates only what is new, as the target does."""
from __future__ import annotations

import pytest

from specserve.config import SamplingParams, SpecParams
from specserve.drafters.draft_model import DraftModelDrafter
from specserve.engine import Engine

LINES = "".join(f"line {i}: the value of x{i} is {i * 7 % 13}\n" for i in range(16))


@pytest.mark.parametrize("reuse", [16, 0])
def test_the_draft_model_keeps_moved_runs_of_its_cache(tiny_models, reuse):
    engine = Engine(tiny_models["target"], tiny_models["draft_close"], n_ctx=1024)
    engine.cache_reuse = reuse
    slot = engine.new_slot()
    evaluated = []
    real_eval = slot.draft_ctx.eval

    def counting_eval(tokens, logits="last"):  # the real pass, counted
        evaluated.append(len(tokens))
        return real_eval(tokens, logits)

    slot.draft_ctx.eval = counting_eval
    params, spec = SamplingParams(max_tokens=6, ignore_eos=True), SpecParams(mode="draft", draft_max=3)
    first = slot.generate(LINES, params, spec)
    n_first = sum(evaluated)
    shifted = LINES[LINES.index("line 3"):]  # the window moved three lines down
    missing = DraftModelDrafter(engine.draft, slot.draft_ctx, cache_reuse=reuse).missing(slot.tokenize_prompt(shifted))
    second = slot.generate(shifted, params, spec)
    n_second = sum(evaluated) - n_first
    slot.close()
    assert first.stats.n_prompt > 300 and n_first >= first.stats.n_prompt - 1
    if reuse:  # the draft's cache takes the shifted prompt as the target's does: a handful of passes' tokens
        assert second.stats.n_cached == second.stats.n_prompt - 1 and n_second < 40
        assert missing < 10  # what --spec auto's prefill judgement is told the draft would evaluate
    else:  # all of it again
        assert second.stats.n_cached < 10 and n_second >= second.stats.n_prompt - 1
        assert missing > second.stats.n_prompt - 10
