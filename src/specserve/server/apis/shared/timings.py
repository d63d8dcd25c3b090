"""llama-server's `timings` object: what a request's prompt and generation took, with speculation's counts."""
from __future__ import annotations

from ...core.jobs import Job


def timings(job: Job) -> dict:
    """The request's timings; in a stream's events before its end (timings_per_token), as far as known."""
    s = job.stats
    prompt_n = s.n_prompt - s.n_cached
    prompt_ms, predicted_ms = 1000 * s.t_prompt, round(1000 * max(0.0, s.t_total - s.t_prompt), 3)
    # the first token comes from the prompt's pass: the rate is over the tokens after it, as llama-server's
    # (the rate from the rounded predicted_ms, so a client recomputing it gets the same number)
    steps = max(0, s.n_generated - 1)
    return {
        "cache_n": s.n_cached,
        "prompt_n": prompt_n,
        "prompt_ms": round(prompt_ms, 3),
        "prompt_per_token_ms": round(prompt_ms / prompt_n, 3) if prompt_n else 0.0,
        "prompt_per_second": round(1000 * prompt_n / prompt_ms, 2) if prompt_n and prompt_ms > 0 else 0.0,
        "predicted_n": s.n_generated,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / steps if steps else 0.0,
        "predicted_per_second": 1e3 / predicted_ms * steps if steps and predicted_ms > 0 else 0.0,
        "draft_n": s.n_drafted,
        "draft_n_accepted": s.n_accepted,
        # under a grammar, json_schema or tools (a specserve extension): the grammar's share of predicted_ms
        **({"grammar_ms": round(1000 * s.t_grammar, 3)} if job.req.sampling.grammar is not None else {}),
    }
