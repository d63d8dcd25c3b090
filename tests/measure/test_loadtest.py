"""The load test (tools/loadtest.py) against a real `specserve serve` (tiny models): levels, latencies,
time per output token, RSS, and the server idle again afterwards."""
from __future__ import annotations

import json
import subprocess
import sys

import httpx

from server_fixtures import ServerProcess, serve_args, tiny_models_dir, wait_for  # noqa: F401
import pytest

pytestmark = pytest.mark.server


def test_loadtest_script_runs_against_a_server(tiny_models_dir, tmp_path):
    srv = ServerProcess(serve_args(tiny_models_dir, "-c", "4096", "--alias", "tiny"), tmp_path / "serve.log",
                        api_key="k")
    try:
        out = tmp_path / "load.json"
        r = subprocess.run([sys.executable, "-m", "specserve.measure.loadtest", "--url", srv.url, "--api-key", "k",
                            "--clients", "1,3", "--duration", "3", "--max-tokens", "16", "--cancel-share", "0.3",
                            "--pid", str(srv.proc.pid), "--json", str(out)],
                           capture_output=True, text=True, timeout=120)
        levels = json.loads(out.read_text())["levels"]
        assert [lv["clients"] for lv in levels] == [1, 3]
        assert all(lv["tpot_p95_s"] >= lv["tpot_p50_s"] > 0 for lv in levels)
        report = levels[-1]
        assert report["completed"] > 0 and report["requests_per_s"] > 0 and report["tokens_per_s"] > 0
        assert report["errors"] == 0 or set(report["error_kinds"]) == {"400 context_length_exceeded"}, r.stdout
        assert report["rss_before_mib"] > 0 and report["latency_p95_s"] >= report["latency_p50_s"] > 0
        assert r.returncode in (0, 3)
        health = httpx.get(srv.url + "/health").json()
        assert wait_for(lambda: httpx.get(srv.url + "/health").json()["slots_processing"] == 0, 10), health
    finally:
        assert srv.stop() == 0
