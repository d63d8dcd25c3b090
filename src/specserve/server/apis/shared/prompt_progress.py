"""llama-server's `return_progress`: `prompt_progress` events before a stream's text, each with the prompt's
total, cached and processed tokens (and `timings` where `timings_per_token` asks).

specserve evaluates the prompt before a stream starts (so that a bad request still gets a proper 400), so
both events are sent then: the prompt before evaluation (processed = cached) and after it."""
from __future__ import annotations

from ...core.jobs import Job
from .timings import timings


def progress_events(job: Job) -> list[tuple[dict, dict]]:
    """(prompt_progress, timings) before and after the prompt was evaluated."""
    s = job.stats
    after = timings(job)
    before = {**after, "prompt_n": 0, "prompt_ms": 0.0, "prompt_per_token_ms": 0.0, "prompt_per_second": 0.0,
              "predicted_n": 0, "predicted_ms": 0.0, "predicted_per_token_ms": 0.0, "predicted_per_second": 0.0,
              "draft_n": 0, "draft_n_accepted": 0}
    return [({"total": s.n_prompt, "cache": s.n_cached, "processed": s.n_cached, "time_ms": 0.0}, before),
            ({"total": s.n_prompt, "cache": s.n_cached, "processed": s.n_prompt,
              "time_ms": round(1000 * s.t_prompt, 3)}, after)]
