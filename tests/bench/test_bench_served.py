"""`specserve bench --via`: the configurations through a `specserve serve` of the bench's own (the
default), beside the same configurations in-process."""
from __future__ import annotations

import json

import pytest

from specserve.bench.runner import IN_PROCESS, plan_configs
from bench_runs import PROMPTS, run_cli

pytestmark = pytest.mark.server


def test_both_paths_run_the_same_requests(tiny_paths, tmp_path):
    """Served and in-process runs of a configuration evaluate the same tokens from the same cold cache:
    greedy, they draft and keep the same tokens step for step, and each served run's speed is the
    client's own measurement."""
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps({"prompt": p, "category": "toy"}) + "\n" for p in PROMPTS))
    code, out = run_cli("bench", "-m", tiny_paths["target"], "-md", tiny_paths["draft_close"], "-c", 512, "-t", 1,
                        "--workload", workload, "--prompts-per-workload", 2, "-n", 16, "--ignore-eos",
                        "--spec", "draft,ngram", "--draft-max", "3", "--via", "server,inprocess", "-np", 1,
                        "--no-progress", "--json", tmp_path / "out.json")
    assert code == 0
    assert "through `specserve serve -np 1`" in out
    report = json.loads((tmp_path / "out.json").read_text())
    served = {e["name"]: e for e in report["configs"] if e["via"] == "server" and e["workload"] == "all"}
    local = {e["name"]: e for e in report["configs"] if e["via"] == "inprocess" and e["workload"] == "all"}
    assert set(served) == {"target", "draft[draft_close] k=3", "ngram k=3"}
    assert set(local) == {name + IN_PROCESS for name in served}
    runs = {(r["config"], r["prompt_index"]): r["stats"] for r in report["runs"]}
    for (name, i), stats in runs.items():
        if name in served:
            twin = runs[(name + IN_PROCESS, i)]
            for key in ("n_prompt", "n_generated", "n_passes", "n_drafted", "n_accepted", "drafter_steps",
                        "accepted_by_position"):
                assert stats[key] == twin[key], (name, i, key)
            assert stats["tokens_per_s"] > 0 and stats["server_tokens_per_s"] > 0
            assert 0 < stats["t_prompt_s"] < stats["t_decode_client_s"] + stats["t_prompt_s"]
    assert served["target"]["speedup"] == 1.0  # the served target alone is the baseline
    paths = {p["name"]: p for p in report["paths"]}
    assert set(paths) == set(served)
    for name, p in paths.items():
        ratios = [runs[(name, i)]["tokens_per_s"] / runs[(name + IN_PROCESS, i)]["tokens_per_s"] for i in (0, 1)]
        assert p["n_prompts"] == 2 and p["min"] == pytest.approx(min(ratios), rel=1e-3, abs=1e-4)
    assert "through the server / in-process" in out


def test_auto_fresh_runs_in_process_beside_served_configurations():
    configs = plan_configs(["auto", "auto-fresh"], ["d"], [4], [], vias=("server",))
    assert [(c.name, c.via) for c in configs] == [("target", "server"), ("auto[d] k<=4", "server"),
                                                   ("auto-fresh[d] k<=4" + IN_PROCESS, "inprocess")]
    plain = plan_configs(["auto"], ["d"], [4], [], vias=("inprocess",))
    assert [(c.name, c.via) for c in plain] == [("target", "inprocess"), ("auto[d] k<=4", "inprocess")]


def test_the_servers_logs_are_kept_where_asked(tiny_paths, tmp_path, monkeypatch):
    """--server-log DIR keeps each of the bench's own servers' logs; with SPECSERVE_LOG=debug, auto's line a step
    (what it planned and why) is there to read after the run."""
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"prompt": PROMPTS[0], "category": "toy"}) + "\n")
    logs = tmp_path / "logs" / "deeper"
    monkeypatch.setenv("SPECSERVE_LOG", "debug")
    code, out = run_cli("bench", "-m", tiny_paths["target"], "-md", tiny_paths["draft_close"], "-c", 512, "-t", 1,
                        "--workload", workload, "--prompts-per-workload", 1, "-n", 16, "--ignore-eos",
                        "--spec", "auto", "--draft-max", "3", "-np", 1, "--no-auto-profile", "--no-progress",
                        "--server-log", logs)
    assert code == 0, out
    kept = sorted(p.name for p in logs.iterdir())
    assert kept == ["serve-draft_close.log"]
    text = (logs / kept[0]).read_text()
    assert "specserve.auto" in text and "a second worth" in text  # auto's step lines, with what it weighed
