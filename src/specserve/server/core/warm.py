"""Warming a slot's caches: the prompt goes into the target's and the draft model's KV cache, and
nothing is generated (GenRequest.warm; llama.vim sends /infill with `n_predict: 0` when its extra
context changes), so that the next request with this prefix evaluates only what is new in both."""
from __future__ import annotations

import time

from ... import steps
from ...drafters.draft_model import DraftModelDrafter
from ...stats import GenerationStats


def warm_steps(slot, tokens: list[int], stats: GenerationStats) -> steps.Steps:
    """Put `tokens` into the slot's caches, the target's and the draft model's, without generating:
    each then holds all but the last token, as a generation over `tokens` would leave them before
    its first step."""
    stats.n_prompt = len(tokens)
    t0 = time.perf_counter()
    try:
        stats.n_cached = yield from steps.sync_prefix(slot.ctx, tokens[:-1], slot.engine.cache_reuse)
        stats.t_prompt = time.perf_counter() - t0
        if slot.draft_ctx is not None:
            t = time.perf_counter()
            drafter = DraftModelDrafter(slot.engine.draft, slot.draft_ctx, cache_reuse=slot.engine.cache_reuse)
            yield from drafter.prefill_steps(tokens)
            stats.t_prompt_draft = stats.t_draft = time.perf_counter() - t
        stats.finish_reason = "length"
    finally:
        stats.t_total = time.perf_counter() - t0
