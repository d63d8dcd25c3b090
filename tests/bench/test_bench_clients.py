"""`specserve bench --clients`: configurations under load, each beside its own no-speculation rate, interleaved.

The load runs are checked against servers whose speed is known: fake llama-servers that stream each token
after a fixed delay (the aggregate and per-request rates must come out of the timings, within bounds), and
the bench's own `specserve serve` on a tiny model."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from specserve.bench.clients import Request, client_work, interleave
from specserve.bench.load_report import percentile, summarize_load
from bench_runs import PROMPTS, run_cli


class FakeLlamaServer:
    """llama-server's streamed /completion at a known speed: each of n_predict tokens `delay` seconds after the
    last; the last event carries timings (and speculative.queue_s where `queue_s` is set). Logs each request's
    arrival as (name, time)."""

    def __init__(self, name: str, delay: float, log: list, queue_s: float | None = None):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                log.append((name, time.perf_counter(), body))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                n = body["n_predict"]
                for _ in range(n):
                    time.sleep(delay)
                    self.wfile.write(b'data: {"content": "x", "stop": false}\n\n')
                    self.wfile.flush()
                last = {"content": "", "stop": True, "tokens_predicted": n,
                        "timings": {"predicted_n": n, "predicted_ms": 1000 * n * delay}}
                if fake.queue_s is not None:
                    last["speculative"] = {"queue_s": fake.queue_s}
                self.wfile.write(f"data: {json.dumps(last)}\n\n".encode())
                self.close_connection = True

        self.queue_s = queue_s
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_baselines_run_beside_their_configurations_alternating():
    order = interleave([("auto", "target"), ("ls-ngram", "ls-plain"), ("lonely", "lonely")], [1, 4])
    assert order == [(1, "target", "auto"), (1, "auto", "auto"),  # baseline first
                     (1, "ls-ngram", "ls-ngram"), (1, "ls-plain", "ls-ngram"),  # then last
                     (1, "lonely", "lonely"),  # its own baseline: once
                     (4, "target", "auto"), (4, "auto", "auto"),
                     (4, "ls-ngram", "ls-ngram"), (4, "ls-plain", "ls-ngram"),
                     (4, "lonely", "lonely")]


def test_each_clients_work_is_fixed_by_the_seed_and_mixed():
    prompts = {w: [Request(w, i, (i,), 8, 0.0, 0) for i in range(5)] for w in ("edit", "question", "story")}
    four, eight = client_work(prompts, 4, 3, seed=1), client_work(prompts, 8, 3, seed=1)
    assert eight[:4] == four  # client i's work does not depend on how many clients there are
    assert client_work(prompts, 4, 3, seed=2) != four
    for i, work in enumerate(four):
        assert [r.workload for r in work] == [["edit", "question", "story"][(i + j) % 3] for j in range(3)]
    sent = [(r.workload, r.index) for work in four for r in work]
    assert len(set(sent)) == len(sent) == 12  # 4 of each workload's 5 prompts: none twice
    sent = [(r.workload, r.index) for work in eight for r in work]
    assert len(set(sent)) == 15 and len(sent) == 24  # 8 of each: all 5, then dealt again


def test_specserve_gets_each_runs_scope_and_an_endpoint_nothing_of_specserves():
    from specserve.bench.clients import LoadTarget

    r = Request("edit", 0, (1, 2), 8, 0.0, 7)
    served = LoadTarget("auto", "http://x", {"speculative": {"mode": "auto", "draft_max": 8}}, ignore_eos=True)
    assert served.body(r, "bench-clients-3") == {
        "prompt": [1, 2], "n_predict": 8, "temperature": 0.0, "seed": 7, "stream": True, "cache_prompt": False,
        "speculative": {"mode": "auto", "draft_max": 8, "cross_request_scope": "bench-clients-3"}, "ignore_eos": True}
    assert "speculative" not in LoadTarget("ls", "http://y").body(r, "bench-clients-3")


def test_percentiles_are_nearest_rank_and_rows_pair_each_run_with_the_baseline_beside_it():
    assert percentile([3.0, 1.0, 2.0, 4.0], 0.5) == 2.0 and percentile([3.0, 1.0, 2.0, 4.0], 0.95) == 4.0
    assert percentile([], 0.5) is None

    def run(config, pair, agg):
        return {"config": config, "pair": pair, "clients": 2, "aggregate_tokens_per_s": agg, "n_generated": 10,
                "requests": [{"decode_tokens_per_s": agg / 2, "ttft_s": 0.5, "queue_s": None, "n_drafted": 0,
                              "n_accepted": 0}]}
    runs = [run("target", "a", 10.0), run("a", "a", 15.0), run("b", "b", 30.0), run("target", "b", 20.0)]
    rows = {r["config"]: r for r in summarize_load(runs, [("a", "target"), ("b", "target")], [2])}
    assert (rows["a"]["baseline_tokens_per_s"], rows["a"]["ratio"]) == (10.0, 1.5)  # not the later 20.0
    assert (rows["b"]["baseline_tokens_per_s"], rows["b"]["ratio"]) == (20.0, 1.5)
    assert rows["target"]["aggregate_tokens_per_s"] == 15.0 and rows["target"]["ratio"] is None
    assert rows["a"]["decode_p50"] == 7.5 and rows["a"]["queue_p50"] is None


@pytest.mark.server
def test_clients_table_against_specserve_and_two_known_speed_servers(tiny_paths, tmp_path):
    """--clients 1,2 through the bench's own `specserve serve` (ngram, beside the same server with speculation
    off) and two fake llama-servers (tokens every 10 ms, paired with one at every 20 ms): the table's
    structure, aggregates that follow from the fakes' speed, queue time where reported, and the order of runs
    as the fake servers saw it."""
    log: list = []
    fast = FakeLlamaServer("fast", 0.01, log, queue_s=0.125)
    plain = FakeLlamaServer("plain", 0.02, log)
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps({"prompt": p, "category": "toy"}) + "\n" for p in PROMPTS))
    try:
        code, out = run_cli("bench", "-m", tiny_paths["target"], "-c", 512, "-t", 1, "--spec", "ngram",
                            "--draft-max", 3, "-np", 2, "--clients", "1,2", "--requests-per-client", 2,
                            "--workload", workload, f"{workload}@0.8", "-n", 16, "--ignore-eos",
                            "--endpoint", f"fast={fast.url}", f"plain={plain.url}/v1", "--endpoint-baseline", "plain",
                            "--no-auto-profile", "--no-progress", "--json", tmp_path / "out.json")
    finally:
        fast.close()
        plain.close()
    assert code == 0
    report = json.loads((tmp_path / "out.json").read_text())
    rows = {(r["config"], r["clients"]): r for r in report["load"]}
    assert set(rows) == {(c, n) for c in ("target", "ngram k=3", "fast", "plain") for n in (1, 2)}
    for header in ("1 client at once, 2 requests each", "2 clients at once, 2 requests each",
                   "aggregate tok/s by clients"):
        assert header in out

    # what ran, in order: each configuration beside its baseline, and each run's aggregate from its own timings
    runs = report["runs"]
    assert [(r["clients"], r["config"], r["pair"]) for r in runs] == interleave(
        [("ngram k=3", "target"), ("fast", "plain")], [1, 2])
    for r in runs:
        assert r["n_requests"] == 2 * r["clients"] and r["n_generated"] == 16 * r["n_requests"]
        assert r["aggregate_tokens_per_s"] == pytest.approx(r["n_generated"] / r["wall_s"], rel=1e-3)
        if r["config"] in ("fast", "plain"):  # N clients streaming a token every d seconds: at most N/d tok/s
            ceiling = r["clients"] / (0.01 if r["config"] == "fast" else 0.02)
            assert 0.4 * ceiling < r["aggregate_tokens_per_s"] < ceiling
    # the fakes saw the same order: warm-ups, then at each count the pair's two runs back to back
    seen = [name for name, _, _ in log]
    blocks = [name for i, name in enumerate(seen) if i == 0 or seen[i - 1] != name]
    assert blocks == ["plain", "fast", "plain", "fast", "plain"]
    assert seen[2:] == ["fast"] * 2 + ["plain"] * 2 + ["fast"] * 4 + ["plain"] * 4
    # every server got the same work, as token ids, at the workloads' temperatures
    def work(start, stop):
        return sorted((b["prompt"], b["temperature"], b["seed"]) for _, _, b in log[start:stop])
    assert work(2, 4) == work(4, 6) and work(6, 10) == work(10, 14)  # fast's and plain's, at 1 and at 2 clients
    assert {t for _, t, _ in work(6, 10)} == {0.0, 0.8} and all(isinstance(t, int) for t in log[2][2]["prompt"])
    assert len({(tuple(p), t) for p, t, _ in work(6, 10)}) == 4  # 2 clients, 2 requests each: none twice
    assert log[0][2]["prompt"] == log[1][2]["prompt"] and log[0][2]["n_predict"] == 8  # the warm-ups: a prompt
    assert log[0][2]["prompt"] not in [b["prompt"] for _, _, b in log[2:]]  # that no measured run sends
    assert not any("speculative" in b for _, _, b in log)

    for n in (1, 2):
        f, p, ngram = rows[("fast", n)], rows[("plain", n)], rows[("ngram k=3", n)]
        assert f["baseline"] == "plain" and 1.4 < f["ratio"] < 2.1  # twice as fast, less the requests' overhead
        assert f["ratio"] == pytest.approx(f["aggregate_tokens_per_s"] / f["baseline_tokens_per_s"], rel=1e-3)
        assert f["decode_p50"] <= 100 and p["decode_p50"] <= 50  # after the first token: at most 1/d tok/s
        assert (f["queue_p50"], f["queue_p95"]) == (0.125, 0.125) and p["queue_p50"] is None
        assert ngram["baseline"] == "target" and ngram["ratio"] > 0 and ngram["queue_p50"] is not None
        assert rows[("target", n)]["ratio"] is None and rows[("target", n)]["ttft_p95"] > 0
    assert rows[("fast", 2)]["aggregate_tokens_per_s"] > 1.4 * rows[("fast", 1)]["aggregate_tokens_per_s"]


def test_a_profile_learnt_elsewhere_is_what_the_benchs_server_starts_from(tiny_paths, tiny_models, tmp_path,
                                                                         monkeypatch):
    """--auto-profile-from FILE: a profile saved for other models (here the draft as target, another key) is
    written under the key the bench's server looks for, in a directory of its own; `empty` holds none."""
    from specserve import learned
    from specserve.auto import Controller
    from specserve.auto.profile import learning_controller
    from specserve.bench.profiles import EMPTY, ProfileHome
    from specserve.config import ModelConfig

    state = Controller().state_dict()
    state["marker"] = "from the other pair"  # kept as given: the controller keeps what it does not read
    other = learned.ProfileStore.for_models(str(tiny_paths["draft_far"]), None, 1, tmp_path / "elsewhere")
    other.save(state, requests=5)
    target = str(tiny_paths["target"])
    for source, loaded in ((str(other.path), True), (EMPTY, False)):
        home = ProfileHome(source, target, [None], n_threads=1)
        try:
            for key, value in home.env.items():
                monkeypatch.setenv(key, value)
            controller = learning_controller(ModelConfig(target), tiny_models["target"])
            assert controller.profile.loaded is loaded
            assert controller.profile.store.path == home.paths[0]
            if loaded:
                assert controller.profile.as_loaded[1] == state
        finally:
            home.close()
        assert not home.paths[0].exists()
    (tmp_path / "other.json").write_text('{"format": "something else"}')
    with pytest.raises(ValueError, match="not an auto profile"):
        ProfileHome(str(tmp_path / "other.json"), target, [None], 1)
    with pytest.raises(ValueError, match="cannot read it"):
        ProfileHome(str(tmp_path / "missing.json"), target, [None], 1)


def test_a_workload_at_a_temperature(tmp_path):
    """NAME@T: the workload's prompts at temperature T (the mixed work's stories at 0.8); a name whose tail is
    no temperature stays a file name."""
    from specserve.bench.workloads import load_workload

    stories = load_workload("writing@0.8", 3)
    assert [(p.workload, p.temperature) for p in stories] == [("writing@0.8", 0.8)] * 3
    assert [p.messages for p in stories] == [p.messages for p in load_workload("writing", 3)]
    odd = tmp_path / "me@home.jsonl"
    odd.write_text(json.dumps({"prompt": "hi", "temperature": 0.3}) + "\n")
    assert [p.temperature for p in load_workload(str(odd), 1)] == [0.3]
    assert [p.temperature for p in load_workload(f"{odd}@0", 1)] == [0.0]


def test_a_failed_request_fails_the_run_naming_the_server_and_stops_the_other_clients():
    import httpx

    from specserve.bench.clients import LoadError, LoadTarget, run_level

    seen = []

    def answer(request):
        body = json.loads(request.content)
        seen.append(body["seed"])
        if body["seed"] == 0:  # client 0's requests fail at once
            return httpx.Response(500, text="no slot")
        time.sleep(0.3)  # client 1's are answered, slowly
        return httpx.Response(200, text='data: {"content": "x", "stop": true, "tokens_predicted": 1}\n\n')
    work = [[Request("edit", i, (1, 2), 8, 0.0, i)] * 3 for i in range(2)]
    with pytest.raises(LoadError, match="ls: http://x/completion: HTTP 500: no slot"):
        run_level(LoadTarget("ls", "http://x"), work, transport=httpx.MockTransport(answer))
    assert sorted(seen) == [0, 1]  # client 1 sent no more once client 0's request had failed


@pytest.mark.parametrize("flags,message", [
    (["--via", "inprocess"], "--clients runs through servers only"),
    (["--auto-profile-from", "empty", "--no-auto-profile"], "contradict each other"),
    (["--requests-per-client", "0"], "--requests-per-client must be > 0"),
    (["--workload", "multi-turn"], "multi-turn workloads are not supported"),
])
def test_what_clients_cannot_run_is_refused_before_any_server_starts(tiny_paths, capsys, flags, message):
    code, _ = run_cli("bench", "-m", tiny_paths["target"], "--clients", "1,2", *flags)
    assert code == 2 and message in capsys.readouterr().err
