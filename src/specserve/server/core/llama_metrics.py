"""llama-server's `llamacpp:` metrics beside specserve's own, so that its dashboards and alerts read this
server unchanged.

llama-server writes them by hand (a `# TYPE` line naming each series in full, `_total` included), which
prometheus_client's counters cannot spell; so they are kept here as plain totals and written as text
after the registry's. Their meanings are llama-server's: prompt tokens are those evaluated (cached ones
apart), a decode is a target pass, a draft is a verification of a non-empty draft; the two throughput
gauges average over the window since the previous scrape.
"""
from __future__ import annotations

import threading

from ...stats import GenerationStats


class LlamaTotals:
    def __init__(self):
        self._lock = threading.Lock()
        self.prompt_tokens = self.prompt_cached = self.predicted = 0
        self.prompt_s = self.predicted_s = 0.0
        self.n_decode = self.busy_slots = self.n_tokens_max = 0
        self.drafted = self.accepted = self.drafts = 0
        self.accepted_per_pos: list[int] = []
        self._window = [0, 0.0, 0, 0.0]  # prompt tokens, seconds, predicted tokens, seconds since the last scrape

    def observe(self, stats: GenerationStats) -> None:
        """One finished generation (the engine thread)."""
        prompt_n = stats.n_prompt - stats.n_cached
        decode_s = max(0.0, stats.t_total - stats.t_prompt)
        with self._lock:
            self.prompt_tokens += prompt_n
            self.prompt_cached += stats.n_cached
            self.prompt_s += stats.t_prompt
            self.predicted += stats.n_generated
            self.predicted_s += decode_s
            self.n_tokens_max = max(self.n_tokens_max, stats.n_prompt + stats.n_generated)
            self.drafted += stats.n_drafted
            self.accepted += stats.n_accepted
            self.drafts += stats.n_passes - stats.drafter_steps.get("none", 0)
            grow = len(stats.accepted_by_position) - len(self.accepted_per_pos)
            self.accepted_per_pos += [0] * max(0, grow)
            for i, n in enumerate(stats.accepted_by_position):
                self.accepted_per_pos[i] += n
            w = self._window
            w[0], w[1], w[2], w[3] = w[0] + prompt_n, w[1] + stats.t_prompt, w[2] + stats.n_generated, w[3] + decode_s

    def target_pass(self, n_seqs: int) -> None:
        """One target forward pass holding `n_seqs` slots' tokens (the engine thread)."""
        with self._lock:
            self.n_decode += 1
            self.busy_slots += n_seqs

    def render(self, processing: int, deferred: int) -> str:
        with self._lock:
            w = self._window
            prompt_rate = w[0] / w[1] if w[1] > 0 else 0.0
            predicted_rate = w[2] / w[3] if w[3] > 0 else 0.0
            self._window = [0, 0.0, 0, 0.0]
            counters = [
                ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens",
                 self.prompt_tokens),
                ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache", self.prompt_cached),
                ("prompt_seconds_total", "Total time spent processing prompts", self.prompt_s),
                ("tokens_predicted_total", "Number of generation tokens processed", self.predicted),
                ("tokens_predicted_seconds_total", "Total time spent generating tokens", self.predicted_s),
                ("n_decode_total", "Total number of target forward passes", self.n_decode),
                ("n_tokens_max", "Largest observed sequence length (prompt + generation)", self.n_tokens_max),
                ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated", self.drafted),
                ("spec_decode_num_accepted_tokens_total",
                 "Speculative: Total draft tokens accepted by the target model", self.accepted),
                ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps",
                 self.drafts),
            ]
            gauges = [
                ("prompt_tokens_seconds", "Average prompt throughput in tokens/s", prompt_rate),
                ("predicted_tokens_seconds", "Average generation throughput in tokens/s", predicted_rate),
                ("requests_processing", "Number of requests processing", processing),
                ("requests_deferred", "Number of requests deferred", deferred),
                ("n_busy_slots_per_decode", "Average number of busy slots per target forward pass",
                 self.busy_slots / max(self.n_decode, 1)),
            ]
            per_pos = list(self.accepted_per_pos)
        lines = []
        for kind, items in (("counter", counters), ("gauge", gauges)):
            for name, help_text, value in items:
                lines += [f"# HELP llamacpp:{name} {help_text}", f"# TYPE llamacpp:{name} {kind}",
                          f"llamacpp:{name} {float(value):g}"]
        if per_pos:
            name = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
            lines += [f"# HELP {name} Accepted tokens per draft position", f"# TYPE {name} counter"]
            lines += [f'{name}{{position="{i}"}} {n}' for i, n in enumerate(per_pos)]
        return "\n".join(lines) + "\n"
