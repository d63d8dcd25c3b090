"""`specserve bench --endpoint` against a real `specserve serve` on a free port."""
from __future__ import annotations

import contextlib
import io
import json
import socket
import subprocess
import sys
import time

import httpx
import pytest

from specserve.cli import main

pytestmark = pytest.mark.server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tiny_paths):
    """`python -m specserve serve` on the tiny target and draft, until the module's tests are done."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "specserve", "serve", "-m", str(tiny_paths["target"]),
                             # --spec draft always drafts: auto may not here
                             "-md", str(tiny_paths["draft_close"]), "--spec", "draft",
                             "-c", "512", "-t", "1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"specserve serve exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                pytest.fail("specserve serve did not become healthy within 60 s")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_endpoint_reported_beside_local_configs(server, tiny_paths, tmp_path):
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"prompt": "the cat sat on the mat"}) + "\n"
                        + json.dumps({"prompt": "the dog ran to the cat"}) + "\n")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["bench", "-m", str(tiny_paths["target"]), "-c", "512", "-t", "1", "--workload", str(workload),
                     "-n", "10", "--ignore-eos", "--spec", "ngram", "--draft-max", "2", "--no-progress",
                     "--endpoint", server, "--json", str(tmp_path / "out.json")])
    assert code == 0
    report = json.loads((tmp_path / "out.json").read_text())
    (endpoint,) = [e for e in report["configs"] if e["spec"] == "endpoint" and e["workload"] == "all"]
    assert endpoint["name"] == f"endpoint {server}" and endpoint["memory_bytes"] is None
    assert endpoint["tokens_per_s"] > 0 and endpoint["ttft_s"] > 0 and endpoint["speedup"] > 0
    assert endpoint["n_generated"] == 2 * 10  # counted from usage, which the server sends
    runs = [r["stats"] for r in report["runs"] if r["config"] == endpoint["name"]]
    assert {r["tokens_counted_from"] for r in runs} == {"usage"}
    assert all(0 < r["time_to_first_token_s"] <= r["t_last_token_s"] <= r["t_total_s"] for r in runs)
    assert endpoint["speedup_e2e"] > 0  # timed to the last token on the bench's clock, as its own configurations
    assert endpoint["acceptance"] is not None  # specserve reports its drafts in usage.speculative
    assert f"endpoint {server}" in out.getvalue()
    assert report["recommendation"]["spec"] != "endpoint"  # only local configurations are recommended


def test_unreachable_endpoint_is_one_clear_error(tiny_paths, capsys):
    code = main(["bench", "-m", str(tiny_paths["target"]), "-c", "256", "-t", "1", "--workload", "qa",
                 "--prompts-per-workload", "1", "-n", "4", "--spec", "ngram", "--draft-max", "1", "--no-progress",
                 "--endpoint", f"http://127.0.0.1:{free_port()}"])
    assert code == 1
    err = capsys.readouterr().err
    assert "specserve: error: http://127.0.0.1:" in err


def test_named_endpoints_paired_against_their_own_target_alone(server, tiny_paths, tmp_path):
    """The same server named twice: as the endpoints' baseline and as a configuration. The endpoints'
    speedups are their tok/s over the baseline's on the same prompt, whatever specserve's own target
    alone runs at (the second request may draft from the server's memory of the first: any ratio)."""
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"prompt": "the cat sat on the mat"}) + "\n")
    code = main(["bench", "-m", str(tiny_paths["target"]), "-c", "512", "-t", "1", "--workload", str(workload),
                 "-n", "10", "--ignore-eos", "--spec", "none", "--via", "inprocess", "--no-progress",
                 "--endpoint", f"own-target={server}", f"other={server}", "--endpoint-baseline", "own-target",
                 "--json", str(tmp_path / "out.json")])
    assert code == 0
    report = json.loads((tmp_path / "out.json").read_text())
    entries = {e["name"]: e for e in report["configs"] if e["workload"] == "all"}
    assert set(entries) == {"target", "own-target", "other"}
    assert entries["own-target"]["speedup"] == 1.0 and entries["own-target"]["baseline"] == "own-target"
    tps = {r["config"]: r["stats"]["tokens_per_s"] for r in report["runs"]}
    assert entries["other"]["baseline"] == "own-target"
    assert entries["other"]["speedup"] == pytest.approx(tps["other"] / tps["own-target"], rel=1e-3)
    assert entries["target"]["baseline"] == "target"
    assert main(["bench", "-m", str(tiny_paths["target"]), "--endpoint", server, "--endpoint-baseline", "nope"]) == 2


def test_each_endpoint_may_be_paired_against_its_own_servers_target_alone():
    """Two servers in one run (llama-server's modes, a specserve with a profile), each with its own
    target alone: NAME=BASE pairs one endpoint against another; a bare name is the rest's baseline."""
    from specserve.bench.runner import endpoint_baselines

    named = [("ls-target", "http://a"), ("ls-ngram", "http://b"), ("prof", "http://c"), ("prof-target", "http://d")]
    assert endpoint_baselines(named, ["ls-target", "prof=prof-target", "prof-target=http://d"]) == {
        "ls-target": "ls-target", "ls-ngram": "ls-target", "prof": "prof-target", "prof-target": "prof-target"}
    assert endpoint_baselines(named, None) == dict.fromkeys(["ls-target", "ls-ngram", "prof", "prof-target"], "target")
    with pytest.raises(ValueError, match="nope"):
        endpoint_baselines(named, ["prof=nope"])
