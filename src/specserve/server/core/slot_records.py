"""What each slot has done, for GET /slots: its current (or last) request, and what speculation did on it.

llama-server's /slots shows each slot's task; specserve adds per-slot counters of its speculation
(requests, tokens, passes, drafted and accepted tokens, by drafter), summed over the slot's requests.
Jobs report here when they take a slot and when they finish (event loop and engine thread: the
counters are plain integers updated under a lock).
"""
from __future__ import annotations

import collections
import itertools
import threading
from dataclasses import dataclass, field

from ...stats import GenerationStats


@dataclass
class SlotRecord:
    """One slot: the last request that ran on it, and its totals."""

    job: object | None = None  # the Job running, or the last that ran (its req and stats)
    id_task: int = -1  # that job's number, counted over the server's jobs
    requests: int = 0
    tokens_generated: int = 0
    prompt_tokens: int = 0
    prompt_tokens_cached: int = 0
    passes: int = 0
    drafted: int = 0
    accepted: int = 0
    drafter_steps: collections.Counter = field(default_factory=collections.Counter)

    def speculation(self) -> dict:
        return {"requests": self.requests, "tokens_generated": self.tokens_generated,
                "prompt_tokens": self.prompt_tokens, "prompt_tokens_cached": self.prompt_tokens_cached,
                "passes": self.passes, "drafted": self.drafted, "accepted": self.accepted,
                "acceptance": round(self.accepted / self.drafted, 4) if self.drafted else 0.0,
                # tokens a target pass yields, the speed-up speculation bought (1.0: the target alone)
                "tokens_per_pass": round(self.tokens_generated / self.passes, 4) if self.passes else 0.0,
                "drafter_steps": dict(self.drafter_steps)}


class SlotRecords:
    def __init__(self, n_slots: int):
        self.slots = [SlotRecord() for _ in range(n_slots)]
        self._tasks = itertools.count()
        self._lock = threading.Lock()

    def started(self, id_slot: int, job) -> None:
        with self._lock:
            rec = self.slots[id_slot]
            rec.job, rec.id_task = job, next(self._tasks)

    def finished(self, id_slot: int, stats: GenerationStats) -> None:
        with self._lock:
            rec = self.slots[id_slot]
            rec.requests += 1
            rec.tokens_generated += stats.n_generated
            rec.prompt_tokens += stats.n_prompt
            rec.prompt_tokens_cached += stats.n_cached
            rec.passes += stats.n_passes
            rec.drafted += stats.n_drafted
            rec.accepted += stats.n_accepted
            rec.drafter_steps.update(stats.drafter_steps)
