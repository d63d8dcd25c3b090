"""Prometheus metrics and the one log line per request.

Each app owns its CollectorRegistry (no global state), so two servers in one
process, or one per test, never share counters. Names follow llama-server's
(`llamacpp:spec_decode_num_draft_tokens_total` -> `specserve:spec_decode_num_draft_tokens_total`).
"""
from __future__ import annotations

import logging

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ...stats import GenerationStats

log = logging.getLogger("specserve.server")

P = "specserve:"
_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_RATE_BUCKETS = (1, 2, 5, 10, 20, 35, 50, 75, 100, 150, 250, 500, 1000)
_TPOT_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5)
_SEQS_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)
_TOKENS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)


class RequestMetrics:
    """The families a finished request feeds, on one registry: the whole server's, or one scope's."""

    def __init__(self, r: CollectorRegistry):
        self.registry = r
        self.requests = Counter(P + "requests", "Generation requests finished, by endpoint and finish reason",
                                ["endpoint", "finish_reason"], registry=r)
        self.prompt_tokens = Counter(P + "prompt_tokens", "Prompt tokens received", registry=r)
        self.prompt_tokens_cached = Counter(P + "prompt_tokens_cached", "Prompt tokens found in a slot's cache",
                                            registry=r)
        self.tokens_predicted = Counter(P + "tokens_predicted", "Tokens generated", registry=r)
        self.n_decode = Counter(P + "n_decode", "Target forward passes while decoding", registry=r)
        self.drafts = Counter(P + "spec_decode_num_drafts", "Steps that verified a non-empty draft", registry=r)
        self.draft_tokens = Counter(P + "spec_decode_num_draft_tokens", "Draft tokens proposed", registry=r)
        self.accepted_tokens = Counter(P + "spec_decode_num_accepted_tokens", "Draft tokens accepted", registry=r)
        self.draft_per_pos = Counter(P + "spec_decode_num_draft_tokens_per_pos",
                                     "Draft tokens proposed at each draft position (0 = first)", ["position"],
                                     registry=r)
        self.accepted_per_pos = Counter(P + "spec_decode_num_accepted_tokens_per_pos",
                                        "Draft tokens accepted at each draft position (0 = first)", ["position"],
                                        registry=r)
        self.drafter_steps = Counter(P + "spec_decode_drafter_steps", "Decoding steps by drafter ('none': no draft)",
                                     ["drafter"], registry=r)
        self.tokens_per_s = Histogram(P + "request_tokens_per_second", "Decoding speed of each request",
                                      buckets=_RATE_BUCKETS, registry=r)
        self.latency = Histogram(P + "request_latency_seconds", "Arrival to last token, by endpoint",
                                 ["endpoint"], buckets=_LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram(P + "time_to_first_token_seconds", "Arrival to first token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.queue_time = Histogram(P + "queue_time_seconds", "Time waiting for a free slot",
                                    buckets=_LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram(P + "time_per_output_token_seconds",
                              "Per request: seconds per generated token after the first",
                              buckets=_TPOT_BUCKETS, registry=r)

    def observe(self, endpoint: str, stats: GenerationStats, queue_s: float, latency_s: float) -> None:
        """Account one finished (or cancelled) generation."""
        self.requests.labels(endpoint, stats.finish_reason or "cancelled").inc()
        self.prompt_tokens.inc(stats.n_prompt)
        self.prompt_tokens_cached.inc(stats.n_cached)
        self.tokens_predicted.inc(stats.n_generated)
        self.n_decode.inc(stats.n_passes)
        self.drafts.inc(stats.n_passes - stats.drafter_steps.get("none", 0))
        self.draft_tokens.inc(stats.n_drafted)
        self.accepted_tokens.inc(stats.n_accepted)
        for pos, (d, a) in enumerate(zip(stats.drafted_by_position, stats.accepted_by_position)):
            self.draft_per_pos.labels(str(pos)).inc(d)
            self.accepted_per_pos.labels(str(pos)).inc(a)
        for drafter, n in stats.drafter_steps.items():
            self.drafter_steps.labels(drafter).inc(n)
        if stats.n_generated:
            self.tokens_per_s.observe(stats.tokens_per_s)
            self.ttft.observe(queue_s + stats.t_first_token)
        if stats.n_generated > 1:
            self.tpot.observe((stats.t_total - stats.t_first_token) / (stats.n_generated - 1))
        self.latency.labels(endpoint).observe(latency_s)
        self.queue_time.observe(queue_s)


class ServerMetrics:
    """Counters, histograms and gauges for one server; and, for each scope an API key confines to,
    that scope's requests alone: what a scoped key's /metrics shows (no other tenant's traffic,
    no server-wide gauges). An unscoped key, or none, sees the whole server."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, busy_slots=lambda: 0, queue_depth=lambda: 0, suffix_store=None, scopes=()):
        r = self.registry = CollectorRegistry()
        self.whole = RequestMetrics(r)
        self.scoped = {scope: RequestMetrics(CollectorRegistry()) for scope in scopes}
        self.errors = Counter(P + "request_errors", "Requests answered with an error, by HTTP status",
                              ["status"], registry=r)
        self.batch_seqs = Histogram(P + "batch_sequences", "Sequences (slots) in each target forward pass",
                                    buckets=_SEQS_BUCKETS, registry=r)
        self.batch_tokens = Histogram(P + "batch_tokens", "Tokens in each target forward pass",
                                      buckets=_TOKENS_BUCKETS, registry=r)
        self.batched_passes = Counter(P + "batched_passes", "Target forward passes holding two or more sequences",
                                      registry=r)
        Gauge(P + "requests_processing", "Requests holding a slot", registry=r).set_function(busy_slots)
        Gauge(P + "requests_deferred", "Requests waiting for a slot (queue depth)",
              registry=r).set_function(queue_depth)
        if suffix_store is not None:  # the cross-request store: how full it is against its bound
            Gauge(P + "cross_request_store_bytes", "Bytes held by the cross-request suffix store",
                  registry=r).set_function(lambda: suffix_store.nbytes)
            Gauge(P + "cross_request_store_max_bytes", "The cross-request store bound (--cross-request-mib)",
                  registry=r).set_function(lambda: suffix_store.max_bytes)
            Gauge(P + "cross_request_store_tokens", "Tokens held by the cross-request store",
                  registry=r).set_function(lambda: suffix_store.n_tokens)
            Gauge(P + "cross_request_store_documents", "Earlier requests held by the cross-request store",
                  registry=r).set_function(lambda: suffix_store.n_docs)

    def target_pass(self, n_seqs: int, n_tokens: int) -> None:
        """One target forward pass (the engine thread calls this)."""
        self.batch_seqs.observe(n_seqs)
        self.batch_tokens.observe(n_tokens)
        if n_seqs > 1:
            self.batched_passes.inc()

    def error(self, status: int) -> None:
        self.errors.labels(str(status)).inc()

    def observe(self, endpoint: str, stats: GenerationStats, queue_s: float, latency_s: float,
                scope: str = "") -> None:
        """Account one finished (or cancelled) generation, in the whole and in its scope's."""
        self.whole.observe(endpoint, stats, queue_s, latency_s)
        if scope in self.scoped:
            self.scoped[scope].observe(endpoint, stats, queue_s, latency_s)

    def render(self, key_scope: str | None = None) -> bytes:
        """The exposition for a caller whose API key confines it to `key_scope` (None: all of it)."""
        if key_scope is None:
            return generate_latest(self.registry)
        return generate_latest(self.scoped.setdefault(key_scope, RequestMetrics(CollectorRegistry())).registry)

def log_request(endpoint: str, model: str, mode: str, stats: GenerationStats, queue_s: float) -> None:
    """The one line per request: sizes, speed, what speculation did, time in queue."""
    drafters = ",".join(f"{k}:{v}" for k, v in sorted(stats.drafter_steps.items())) or "-"
    log.info("%s model=%s spec=%s | prompt %d tok (%d cached) | generated %d tok, %.1f tok/s | drafted %d "
             "accepted %d (%.1f%%) tau %.2f | drafters %s | queue %.3f s | %s",
             endpoint, model, mode, stats.n_prompt, stats.n_cached, stats.n_generated, stats.tokens_per_s,
             stats.n_drafted, stats.n_accepted, 100 * stats.acceptance, stats.mean_accepted_len, drafters,
             queue_s, stats.finish_reason or "cancelled")
