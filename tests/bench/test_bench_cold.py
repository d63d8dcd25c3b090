"""Every measured request is cold: the warm-ups run on a request of their own (no measured prompt may sit
in a server's prompt cache before it is measured), and endpoints are asked with `cache_prompt: false`, as
the bench's own servers are."""
from __future__ import annotations

import json

import httpx

from specserve.bench import BenchPlan, load_workload, plan_configs, run_benchmark
from specserve.bench.endpoint import EndpointClient
from specserve.bench.runner import WARMUP_MESSAGES
from bench_runs import FakeLocal


def test_warm_ups_never_send_a_measured_prompt():
    configs = plan_configs(["ngram"], [], [4], [])
    prompts = load_workload("code-edit", 2)
    local = FakeLocal()
    run_benchmark(BenchPlan(configs, prompts, [0.0], 8), local, {}, progress=False)
    warmups, runs = local.calls[:len(configs)], local.calls[len(configs):]
    assert all(m == list(WARMUP_MESSAGES) for _, _, m, _ in warmups)
    assert all(m is None for _, _, m, _ in runs)  # the measured runs send the prompt itself
    assert {m["content"] for m in WARMUP_MESSAGES}.isdisjoint(
        m["content"] for p in prompts for m in p.messages)


def test_an_endpoint_is_asked_for_a_cold_prompt():
    sent = []

    def server(request: httpx.Request) -> httpx.Response:  # a stream of one token
        sent.append(json.loads(request.content))
        return httpx.Response(200, text='data: {"choices": [{"delta": {"content": "hi"}, "finish_reason": "stop"}]}'
                                        "\n\ndata: [DONE]\n\n")

    client = EndpointClient("http://127.0.0.1:9", model="m", transport=httpx.MockTransport(server))
    out = client.generate([{"role": "user", "content": "hi"}], 8, 0.0, 1)
    assert sent[0]["cache_prompt"] is False and sent[0]["max_tokens"] == 8
    assert out["text"] == "hi" and out["finish_reason"] == "stop"
