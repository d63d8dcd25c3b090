"""The server's life: the bounded queue, draining on SIGTERM, bad flags.

Each test starts its own `specserve serve` subprocess (tiny models, one thread).
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from server_fixtures import ServerProcess, serve_args, tiny_models_dir, wait_for  # noqa: E402,F401

pytestmark = pytest.mark.server

C = "/v1/completions"
LONG = {"prompt": "the cat", "max_tokens": 4000, "ignore_eos": True, "stream": True, "speculative": {"mode": "none"}}


def test_queue_bound_then_sigterm_drains(tiny_models_dir, tmp_path):
    """One slot, a queue of one: the third request is refused; SIGTERM lets both finish, then exits 0."""
    srv = ServerProcess(serve_args(tiny_models_dir, "-c", "4096", "--parallel", "1", "--queue", "1"),
                        tmp_path / "serve.log")
    try:
        results, first = {}, threading.Event()

        def long_stream():
            with httpx.Client(base_url=srv.url, timeout=120) as c, c.stream("POST", C, json=LONG) as r:
                events = []
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        first.set()
                        events.append(line[6:])
                results["long"] = events

        def queued():
            results["queued"] = httpx.post(srv.url + C, json={"prompt": "the dog", "max_tokens": 16}, timeout=120)

        a = threading.Thread(target=long_stream)
        a.start()
        assert first.wait(30)
        b = threading.Thread(target=queued)
        b.start()
        assert wait_for(lambda: httpx.get(srv.url + "/health").json()["queue_depth"] == 1)

        full = httpx.post(srv.url + C, json={"prompt": "x", "max_tokens": 4})
        assert full.status_code == 503 and full.headers["retry-after"]
        assert full.json()["error"]["code"] == "queue_full"

        srv.proc.send_signal(signal.SIGTERM)
        assert wait_for(lambda: httpx.get(srv.url + "/health").status_code == 503)
        late = httpx.post(srv.url + C, json={"prompt": "x", "max_tokens": 4})
        assert late.status_code == 503 and late.json()["error"]["code"] == "draining"
        assert srv.proc.poll() is None, "exited before the requests in flight finished"

        a.join(120)
        b.join(120)
        long_events = results["long"]
        assert long_events[-1] == "[DONE]"
        final = json.loads(long_events[-2])
        assert final["choices"][0]["finish_reason"] == "length" and final["usage"]["completion_tokens"] == 4000
        assert results["queued"].status_code == 200
        assert results["queued"].json()["usage"]["completion_tokens"] == 16
        assert srv.proc.wait(30) == 0
        assert "draining" in srv.log()
    finally:
        srv.stop()


def test_idle_server_exits_0_on_sigterm(tiny_models_dir, tmp_path):
    srv = ServerProcess(serve_args(tiny_models_dir, "-c", "256"), tmp_path / "serve.log")
    assert srv.stop(timeout=30) == 0


@pytest.mark.parametrize("flags,message", [
    (["--profile", "code=warp=9"], "unknown option"),
    (["--profile", "code=spec=fast"], "speculative mode"),
    (["--profile", "nameonly"], "NAME=key=value"),
    (["--profile", "a=spec=none", "--profile", "a=spec=ngram"], "used twice"),
    (["--parallel", "0"], "--parallel"),
    (["--queue", "-1"], "--queue"),
    (["--batch-size", "0"], "--batch-size must be >= 66"),
    (["--ubatch-size", "0"], "--ubatch-size must be >= 1"),
    (["-ubd", "0"], "--ubatch-size-draft must be >= 1"),
    # issue 15: a profile that every request would have failed on refuses to start
    (["--profile", "p=seed=-1"], "seed must be in [0, 2^64)"),
    (["--profile", "p=temperature=inf"], "temperature must be in [0, 100]"),
    (["--api-key-file", "/nonexistent/keys"], "--api-key-file"),
    (["--read-timeout", "0"], "read_timeout"),
    (["--drain-timeout", "nan"], "drain_timeout"),
    (["--max-connections", "3"], "max_connections"),
])
def test_bad_flags_exit_2_before_loading(tiny_models_dir, flags, message):
    r = subprocess.run([sys.executable, "-m", "specserve", "serve", *serve_args(tiny_models_dir), *flags],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and message in r.stderr, r.stderr
