"""A real `specserve serve --parallel 3`: concurrent clients share target passes and each gets the text
it gets alone; /metrics shows the batches."""
from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from server_fixtures import ServerProcess, metrics, post, serve_args, tiny_models_dir  # noqa: E402,F401

pytestmark = pytest.mark.server

PROMPTS = ["the cat sat on the mat", "Once upon a time", "the dog ran in the park and"]
SPECS = [{"mode": "draft", "draft_max": 4}, {"mode": "ngram", "draft_max": 3}, {"mode": "none"}]


@pytest.fixture(scope="module")
def server(tiny_models_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("server_batch_log") / "serve.log"
    srv = ServerProcess(serve_args(tiny_models_dir, "-c", "512", "--parallel", "3", "--queue", "8",
                                   "--batch-size", "128"), log)
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in srv.log() and "internal error" not in srv.log()


def _complete(server, body: dict) -> list[str]:
    return post(server, "/v1/completions", body)["choices"][0]["text"]


def test_concurrent_clients_are_batched_and_get_their_own_text(server):
    bodies = [{"prompt": p, "max_tokens": 160, "temperature": 0, "ignore_eos": True, "speculative": s}
              for p, s in zip(PROMPTS, SPECS)]
    alone = [_complete(server, b) for b in bodies]
    with server.client() as c:
        before = metrics(c)
    with ThreadPoolExecutor(len(bodies)) as pool:
        together = list(pool.map(lambda b: _complete(server, b), bodies))
    assert together == alone
    with server.client() as c:
        after = metrics(c)
    assert after["specserve:batched_passes_total"] - before.get("specserve:batched_passes_total", 0) > 0
    assert after["specserve:batch_sequences_count"] > after["specserve:batch_sequences_bucket{le=1.0}"]
    assert after["specserve:batch_tokens_sum"] > after["specserve:batch_tokens_count"]
    assert after["specserve:time_per_output_token_seconds_count"] == 6
    assert after["specserve:queue_time_seconds_count"] == 6


def test_interference_check_measures_streams_around_a_long_prompt(server, tmp_path):
    """The check behind the 2,000-token interference figure, against a real server: streams run, a long
    prompt arrives, each stream's time per output token is reported before and while it is processed."""
    import json
    import subprocess

    def measure() -> dict:
        # 440: the streams' prompts (up to 68 tokens) and their max_tokens must fit the 512-token context
        out = tmp_path / "inter.json"
        r = subprocess.run([sys.executable, "-m", "specserve.measure.interference", "--url", server.url, "--streams",
                            "2", "--prompt-tokens", "100", "--max-tokens", "440", "--warmup", "0.1", "--json", str(out),
                            # a token a chunk: the control is timed at the window's chunk positions
                            "--body", '{"speculative": {"mode": "none"}}'],
                           capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stdout + r.stderr
        return json.loads(out.read_text())

    def timed(report) -> bool:  # a stream timed during the prompt and over the same positions alone
        return any(s["tpot_control_s"] and s["slowdown_vs_control"] for s in report["streams_detail"])

    report = measure()
    for _ in range(3):  # the tiny model's prompt (24 ms here) can fall between two of a stream's steps: again,
        if timed(report):  # on new prompts (each check's are its own: nothing to draft from the last one's)
            break
        report = measure()
    assert report["errors"] == [] and report["prompt_tokens"] > 100 and report["prompt_seconds"] > 0
    # chunks with text: a token may add none, a speculative step several
    assert all(s["tokens"] > 100 for s in report["streams_detail"]), json.dumps(report)
    assert any(s["tpot_before_s"] for s in report["streams_detail"])  # the tiny model may finish a stream early
    assert all("tpot_after_s" in s and "after_vs_before" in s for s in report["streams_detail"])
    # the control: the same streams alone first, timed over the same token positions as the window
    assert timed(report), json.dumps(report)
    assert report["slowdown_vs_control_max"] and report["growth_max"]


def test_each_requests_queue_time_and_rate_are_in_its_usage_and_in_metrics(server):
    """Five clients at once on three slots: two wait. Each answer's usage.speculative says how long it waited
    (queue_s) and at what rate it decoded (tokens_per_s), and /metrics' histograms sum the same values: what
    `specserve bench --clients` reports per request, the server's own counters agree with."""
    bodies = [{"prompt": p, "max_tokens": 120, "temperature": 0, "ignore_eos": True, "speculative": s}
              for p, s in zip(PROMPTS + PROMPTS[:2], SPECS + SPECS[:2])]
    with server.client() as c:
        before = metrics(c)
    with ThreadPoolExecutor(len(bodies)) as pool:
        usages = [u["speculative"] for u in pool.map(lambda b: post(server, "/v1/completions", b)["usage"], bodies)]
    with server.client() as c:
        after = metrics(c)

    def delta(name: str) -> float:
        return after[name] - before.get(name, 0.0)
    assert delta("specserve:queue_time_seconds_count") == delta("specserve:request_tokens_per_second_count") == 5
    # five at once on three slots: some found no free slot (at least one even where a loaded machine starts
    # the clients' threads apart, so that a request ends before the last arrives)
    assert sorted(u["queue_s"] > 0 for u in usages).count(True) >= 1
    assert delta("specserve:queue_time_seconds_sum") == pytest.approx(sum(u["queue_s"] for u in usages), abs=5e-4)
    assert delta("specserve:request_tokens_per_second_sum") == pytest.approx(
        sum(u["tokens_per_s"] for u in usages), abs=0.05)
