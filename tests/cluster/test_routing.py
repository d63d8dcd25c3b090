"""Prefix affinity without Ray: routing keys, the rendezvous ranking, the overload fallback,
the summed /metrics, the scaling config, and the affinity simulation."""
from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specserve.bench.affinity_sim import simulate
from specserve.cluster.app import ScaleConfig
from specserve.cluster.metrics_merge import merge
from specserve.cluster.routing import rank, route, route_key


def _chat(*messages, **extra) -> bytes:
    return json.dumps({"messages": [{"role": r, "content": c} for r, c in messages], **extra}).encode()


def test_a_conversation_keeps_its_key_turn_after_turn():
    first = _chat(("system", "be brief"), ("user", "write fizzbuzz"))
    later = _chat(("system", "be brief"), ("user", "write fizzbuzz"), ("assistant", "def f(): ..."),
                  ("user", "rename it"), max_tokens=64, stream=True)
    other = _chat(("system", "be brief"), ("user", "write quicksort"))
    assert route_key("/v1/chat/completions", first) == route_key("/v1/chat/completions", later)
    assert route_key("/v1/chat/completions", first) != route_key("/v1/chat/completions", other)


@pytest.mark.parametrize("body, keyed", [
    (b'{"prompt": "hello"}', True),
    (b'{"prompt": [1, 2, 3]}', True),
    (b"not json", False),  # goes to the least loaded replica; the replica answers the 400
    (b"[1, 2]", False),
    (b"", False),
    (b'{"max_tokens": 3}', False),
])
def test_route_key_of_odd_bodies(body, keyed):
    assert bool(route_key("/v1/completions", body)) is keyed


def test_raw_prompts_key_on_their_head():
    long = "x" * 5000
    assert route_key("/completion", json.dumps({"prompt": long + "a"}).encode()) == \
        route_key("/completion", json.dumps({"prompt": long + "b"}).encode())


def test_infill_keystrokes_key_on_the_file_above_the_cursor():
    """/infill's `prompt` is the line being typed: keystrokes on one file share a key (and a
    replica's caches), another file gets its own."""
    def body(prefix: str, prompt: str) -> bytes:
        return json.dumps({"input_prefix": prefix, "input_suffix": "\n", "prompt": prompt}).encode()

    a = "import os\n\ndef f():\n"
    assert route_key("/infill", body(a, "    re")) == route_key("/infill", body(a, "    retu"))
    assert route_key("/infill", body(a, "    re")) != route_key("/infill", body("import re\n", "    re"))


def test_rendezvous_moves_only_the_keys_of_a_removed_replica():
    ids = ["r0", "r1", "r2", "r3"]
    keys = [f"k{i}" for i in range(400)]
    home = {k: rank(k, ids)[0] for k in keys}
    assert 70 < sum(h == "r2" for h in home.values()) < 130  # about a quarter each
    after = {k: rank(k, [r for r in ids if r != "r2"])[0] for k in keys}
    assert all(after[k] == home[k] for k in keys if home[k] != "r2")


def test_route_tiers():
    key = "k1"
    home, second = rank(key, ["a", "b", "c"])[:2]
    others = [r for r in ("a", "b", "c") if r != home]
    idle = {"a": 0, "b": 0, "c": 0}
    assert route(key, idle, overload=2)[0] == [home]
    assert route(key, {**idle, home: None}, overload=2)[0] == [home]  # unknown load: treated as idle
    busy = {**idle, home: 2}
    tiers = route(key, busy, overload=2)
    assert sorted(tiers[0]) == sorted(others) and tiers[1] == [home]  # overloaded: spill, home last
    full = {r: 3 for r in idle}
    assert route(key, full, overload=2)[0] == [home]  # everyone overloaded: stay home (queue where cached)
    assert route("", idle, overload=2) == [["a", "b", "c"]]  # no key: least loaded of all
    assert route(key, {}, overload=2) == []
    assert route(key, {"a": 5}, overload=2) == [["a"]]


def _text(requests: float, busy: float, created: float) -> str:
    return (f"# HELP specserve:requests_total Requests\n# TYPE specserve:requests_total counter\n"
            f'specserve:requests_total{{endpoint="chat",finish_reason="stop"}} {requests}\n'
            f'specserve:requests_created{{endpoint="chat",finish_reason="stop"}} {created}\n'
            f"# HELP specserve:requests_processing Busy\n# TYPE specserve:requests_processing gauge\n"
            f"specserve:requests_processing {busy}\n")


def test_metrics_are_summed_per_sample():
    text = merge([_text(3, 1, 100.0), _text(4, 2, 50.0)], [("specserve:replicas_reporting", "n", 2)])
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    chat = (("endpoint", "chat"), ("finish_reason", "stop"))
    assert samples[("specserve:requests_total", chat)] == 7
    assert samples[("specserve:requests_created", chat)] == 50.0  # the earliest, not a sum
    assert samples[("specserve:requests_processing", ())] == 3
    assert samples[("specserve:replicas_reporting", ())] == 2


def test_scale_config():
    fixed = ScaleConfig(replicas=2).engine_options(slots=2, queue=16, drain_timeout=20)
    assert fixed["num_replicas"] == 2 and fixed["max_ongoing_requests"] == 18 and "autoscaling_config" not in fixed
    auto = ScaleConfig(replicas=2, min_replicas=1, max_replicas=4).engine_options(2, 16, 20)
    assert auto["autoscaling_config"]["target_ongoing_requests"] == 2  # the slots: more would queue
    assert auto["autoscaling_config"]["initial_replicas"] == 2 and "num_replicas" not in auto
    for bad in (dict(replicas=0), dict(min_replicas=3, max_replicas=2), dict(replicas=5, max_replicas=4),
                dict(target_ongoing=0)):
        with pytest.raises(ValueError):
            ScaleConfig(**bad)


def test_affinity_beats_random_routing_in_simulation():
    aff = simulate(replicas=4, conversations=40, policy="affinity", seed=0)
    rnd = simulate(replicas=4, conversations=40, policy="random", seed=0)
    assert aff["reusable_share"] == 0.75  # 4 turns a conversation; the first cannot hit
    assert aff["hit_rate"] >= 0.8 * aff["reusable_share"]  # only moves off a busy home miss
    assert rnd["hit_rate"] < 0.6 * aff["hit_rate"]
    assert simulate(replicas=1, conversations=40, policy="random", seed=0)["hit_rate"] == 0.75
