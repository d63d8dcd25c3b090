"""`specserve serve --replicas 2` on a local Ray: the single server's contract through Ray Serve,
prefix affinity, summed /metrics, and a replica killed under load.

One Ray instance for the module (starting one takes ~15 s on 2 cores): two replicas of the
tiny pair, one thread each. Skipped without the `ray` extra.
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
import pytest

pytest.importorskip("ray")
pytest.importorskip("ray.serve")

from server_fixtures import API_KEY, ServerProcess, serve_args, tiny_models_dir  # noqa: E402,F401

READY_TIMEOUT_S = 300.0  # Ray, then two model loads, on a busy machine
TENANT_KEY = "key-of-tenant-a"  # confined to a scope: its /metrics holds its own requests only
PROMPTS = ["def add(a, b):", "The capital of France is", "Once upon a time", "import numpy as np\n"]


class ReplicaServer(ServerProcess):
    """`specserve serve --replicas N`; ready when every replica reports to /health."""

    def __init__(self, args, log_path, replicas: int, **kw):
        self.replicas = replicas
        super().__init__([*args, "--replicas", str(replicas)], log_path,
                         env={"RAY_ADDRESS": "", "RAY_DEDUP_LOGS": "0"}, **kw)

    def client(self, timeout: float = 120) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=timeout)

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=30).json()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                if self.health().get("replicas_reporting") == self.replicas:
                    return
            except (httpx.TransportError, ValueError):
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"replicas not ready after {READY_TIMEOUT_S} s:\n{self.log()[-3000:]}")

    def stop(self, timeout: float = 180) -> int:  # Serve drains each deployment in turn; pauses happen
        return super().stop(timeout)


@pytest.fixture(scope="module")
def cluster(tiny_models_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("ray")
    (d / "keys").write_text(f"{TENANT_KEY} scope=tenant-a\n")
    server = ReplicaServer(serve_args(tiny_models_dir, "-np", "2", "--api-key-file", str(d / "keys")), d / "serve.log",
                           replicas=2, api_key=API_KEY)
    yield server
    assert server.stop() == 0, server.log()[-3000:]


@pytest.fixture(scope="module")
def single(tiny_models_dir, tmp_path_factory):
    server = ServerProcess(serve_args(tiny_models_dir, "-np", "2"), tmp_path_factory.mktemp("one") / "serve.log")
    yield server
    server.stop()


def _complete(client, prompt: str, **kw) -> dict:
    r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 24, "temperature": 0, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def test_same_greedy_text_as_one_server(cluster, single):
    with cluster.client() as c, single.client() as s:
        for p in PROMPTS:
            assert _complete(c, p)["choices"][0]["text"] == _complete(s, p)["choices"][0]["text"]


def test_streaming_and_errors_pass_through(cluster):
    with cluster.client(timeout=120) as c:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 12, "stream": True,
                "stream_options": {"include_usage": True}}
        with c.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        assert json.loads(lines[-2][6:])["usage"]["completion_tokens"] == 12
        r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 0})
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    assert httpx.post(cluster.url + "/v1/completions", json={"prompt": "x"}, timeout=30).status_code == 401
    assert httpx.get(cluster.url + "/metrics", timeout=30).status_code == 401
    assert httpx.get(cluster.url + "/health", timeout=30).status_code == 200  # open, as on one server


def test_prefix_affinity_finds_the_cache(cluster):
    """A conversation's next turn lands where its prefix is cached: every second turn reuses tokens."""
    with cluster.client(timeout=120) as c:
        for i in range(6):
            first = [{"role": "user", "content": f"conversation {i}: tell me about topic {i * 7}"}]
            r1 = c.post("/v1/chat/completions", json={"messages": first, "max_tokens": 8, "temperature": 0})
            answer = r1.json()["choices"][0]["message"]["content"]
            nxt = [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": "and then?"}]
            r2 = c.post("/v1/chat/completions", json={"messages": nxt, "max_tokens": 8, "temperature": 0})
            cached = r2.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert cached >= r1.json()["usage"]["prompt_tokens"] - 1, (i, cached)


def test_metrics_sum_the_replicas(cluster):
    time.sleep(2.5)  # replicas report every second
    with cluster.client(timeout=60) as c:
        before = _samples(c.get("/metrics").text)
        for p in PROMPTS:
            _complete(c, p, max_tokens=5)
        time.sleep(2.5)
        after = _samples(c.get("/metrics").text)
    assert after["specserve:replicas_reporting"] == 2
    assert after["specserve:tokens_predicted_total"] - before["specserve:tokens_predicted_total"] == 5 * len(PROMPTS)


def test_metrics_show_a_scoped_key_its_scope_alone(cluster):
    with httpx.Client(base_url=cluster.url, headers={"Authorization": f"Bearer {TENANT_KEY}"}, timeout=120) as c:
        time.sleep(2.5)  # replicas report every second
        before = _samples(c.get("/metrics").text).get("specserve:tokens_predicted_total", 0.0)
        _complete(c, "Once upon a time", max_tokens=3, ignore_eos=True)
        time.sleep(2.5)
        after = _samples(c.get("/metrics").text)
    assert after["specserve:tokens_predicted_total"] - before == 3
    assert "specserve:replicas_reporting" not in after and "specserve:batched_passes_total" not in after


def _samples(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_killed_replica_fails_only_its_streams_and_comes_back(cluster):
    """SIGKILL one replica under load from 4 clients: plain requests all succeed (retried on the other
    replica); a stream may fail only if it was running there, and then with an error event, not a hang.
    /health shows the loss, then the restarted replica."""
    victim = cluster.health()["replicas"][0]
    stop, lock = threading.Event(), threading.Lock()
    tally = {"ok": 0, "stream_errors": [], "other": []}

    def client_loop(n: int) -> None:
        with cluster.client(timeout=120) as c:
            while not stop.is_set():
                prompt = f"client {n} request {tally['ok']}: {PROMPTS[n % len(PROMPTS)]}"
                try:
                    if n % 2:
                        _complete(c, prompt, max_tokens=48, ignore_eos=True)
                    else:
                        with c.stream("POST", "/v1/completions", json={"prompt": prompt, "max_tokens": 48,
                                                                      "ignore_eos": True, "stream": True}) as r:
                            assert r.status_code == 200, r.read()
                            events = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
                        if events[-1] != "data: [DONE]":
                            err = json.loads(events[-1][6:])["error"]
                            with lock:
                                tally["stream_errors"].append(err["code"])
                            continue
                    with lock:
                        tally["ok"] += 1
                except Exception as e:  # noqa: BLE001 - counted, and the assertion shows it
                    with lock:
                        tally["other"].append(repr(e)[:300])

    threads = [threading.Thread(target=client_loop, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    time.sleep(3)
    os.kill(victim["pid"], signal.SIGKILL)
    saw_loss, back = False, False
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not back:
        h = cluster.health()
        saw_loss = saw_loss or h["status"] != "ok" or h["replicas_reporting"] < 2
        back = saw_loss and h["status"] == "ok" and h["replicas_reporting"] == 2 and \
            victim["pid"] not in [r["pid"] for r in h["replicas"]]
        time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join(180)
    assert not any(t.is_alive() for t in threads), "a client hung"
    assert saw_loss and back, cluster.health()
    assert tally["other"] == [], tally
    assert set(tally["stream_errors"]) <= {"replica_failed"} and len(tally["stream_errors"]) <= 2, tally
    assert tally["ok"] > 0
    with cluster.client(timeout=120) as c:  # both replicas serve again
        for p in PROMPTS:
            _complete(c, p)
