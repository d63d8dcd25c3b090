"""The drain on SIGTERM has a deadline: streams still running at it end cleanly with a `draining` error event,
queued requests get 503, and a second signal ends the drain at once.

Each test starts its own server (one slot, a queue of one); they also check an API key file's comments and blank
lines, and that CORS and authentication are off by default.
"""
from __future__ import annotations

import json
import signal
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from server_fixtures import ServerProcess, serve_args, tiny_models_dir  # noqa: E402,F401

from defended_servers import C, LONG, WEB, health, wait_for  # noqa: E402

pytestmark = pytest.mark.server


def _drain_scene(srv, headers: dict, signals: int) -> tuple[list[str], httpx.Response | None, float]:
    """A long stream holding the one slot and a request queued behind it; then `signals` SIGTERMs.
    Returns the stream's data lines, the queued request's answer, and seconds from the first signal to exit."""
    got, first = {}, threading.Event()

    def stream():
        with httpx.Client(base_url=srv.url, headers=headers, timeout=120) as c, \
                c.stream("POST", C, json={**LONG, "max_tokens": 16000}) as r:
            lines = []
            for line in r.iter_lines():
                if line.startswith("data: "):
                    first.set()
                    lines.append(line[6:])
            got["stream"] = lines

    def queued():
        got["queued"] = httpx.post(srv.url + C, json={"prompt": "the dog", "max_tokens": 8}, headers=headers,
                                   timeout=120)

    a, b = threading.Thread(target=stream), threading.Thread(target=queued)
    a.start()
    assert first.wait(30)
    b.start()
    assert wait_for(lambda: health(srv)["queue_depth"] == 1)
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    assert wait_for(lambda: health(srv)["status"] == "draining", 10)
    if signals == 2:
        srv.proc.send_signal(signal.SIGTERM)
    a.join(120)
    b.join(120)
    assert srv.proc.wait(60) == 0
    return got.get("stream", []), got.get("queued"), time.monotonic() - t0


def _ended_by_the_drain(events: list[str], queued: httpx.Response | None) -> None:
    assert events and events[-1] != "[DONE]"
    assert json.loads(events[-1])["error"]["code"] == "draining"
    assert queued is not None and queued.status_code == 503 and queued.json()["error"]["code"] == "draining"


def test_the_drain_ends_streams_cleanly_at_its_deadline(tiny_models_dir, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# one key per line\nfirst-key\n\nsecond-key\n")
    srv = ServerProcess(serve_args(tiny_models_dir, "-c", "16384", "--parallel", "1", "--queue", "1",
                                   "--drain-timeout", "1", "--api-key-file", str(keys)), tmp_path / "serve.log")
    try:
        assert httpx.get(srv.url + "/v1/models", headers={"X-Api-Key": "first-key"}).status_code == 200
        events, queued, seconds = _drain_scene(srv, {"Authorization": "Bearer second-key"}, signals=1)
        _ended_by_the_drain(events, queued)
        assert seconds < 15
        assert "drain deadline" in srv.log()
    finally:
        srv.stop()


def test_a_second_signal_ends_the_drain_at_once(tiny_models_dir, tmp_path):
    srv = ServerProcess(serve_args(tiny_models_dir, "-c", "16384", "--parallel", "1", "--queue", "1",
                                   "--drain-timeout", "600", "--api-key", ""), tmp_path / "serve.log")
    try:
        preflight = httpx.options(srv.url + C, headers={"Origin": WEB, "Access-Control-Request-Method": "POST"})
        assert "access-control-allow-origin" not in preflight.headers  # CORS is off by default
        events, queued, seconds = _drain_scene(srv, {}, signals=2)
        _ended_by_the_drain(events, queued)
        assert seconds < 15
        assert "authentication is off" in srv.log()
    finally:
        srv.stop()
