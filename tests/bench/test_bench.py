"""`specserve bench` on tiny models: consistent JSON, paired speedups, ranking, interleaving."""
from __future__ import annotations

import json

import pytest

from specserve.bench.report import ALL
from bench_runs import PROMPTS, run_cli

CONFIG_FIELDS = {"name", "spec", "draft_model", "draft_max", "temperature", "workload", "tokens_per_s", "speedup",
                 "speedup_median", "acceptance", "mean_accepted_len", "acceptance_by_position", "ttft_s", "rank",
                 "n_prompts", "n_runs", "memory_bytes", "flags", "drafter_steps", "decode_tokens_per_s"}
N_CONFIGS = 7  # target, draft k=1,2, ngram k=1,2, suffix, auto


@pytest.fixture(scope="module")
def bench(tiny_paths, tmp_path_factory):
    """One small benchmark: 2 workloads x 2 prompts x 2 temperatures x 2 repeats x 6 configurations."""
    d = tmp_path_factory.mktemp("bench")
    workload = d / "w.jsonl"
    workload.write_text("".join(json.dumps({"prompt": p, "category": "toy"}) + "\n" for p in PROMPTS))
    code, out = run_cli("bench", "-m", tiny_paths["target"], "-md", tiny_paths["draft_close"], "-c", 512, "-t", 1,
                        "--workload", workload, "code-edit", "--prompts-per-workload", 2, "-n", 12, "--ignore-eos",
                        "--draft-max", "1,2", "--temp", 0, 0.7, "--repeat", 2, "--no-progress",
                        "--json", d / "out.json", "--plot", d / "out.png")
    assert code == 0
    return {"stdout": out, "report": json.loads((d / "out.json").read_text()), "png": d / "out.png"}


def groups(report) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = {}
    for e in report["configs"]:
        out.setdefault((e["workload"], e["temperature"]), []).append(e)
    return out


def test_every_group_has_every_configuration_with_every_field(bench):
    g = groups(bench["report"])
    assert set(g) == {(w, t) for w in ("w", "code-edit", ALL) for t in (0.0, 0.7)}
    for (workload, _), entries in g.items():
        assert len(entries) == N_CONFIGS
        assert {e["n_prompts"] for e in entries} == {4 if workload == ALL else 2}
        for e in entries:
            assert CONFIG_FIELDS <= set(e), CONFIG_FIELDS - set(e)
            assert e["tokens_per_s"] > 0 and e["ttft_s"] > 0
    names = {e["name"] for e in bench["report"]["configs"]}
    assert names == {"target", "draft[draft_close] k=1", "draft[draft_close] k=2", "ngram k=1", "ngram k=2",
                     "suffix k<=64", "auto[draft_close] k<=2"}


def test_target_alone_is_1x_by_construction(bench):
    for entries in groups(bench["report"]).values():
        (target,) = [e for e in entries if e["spec"] == "none"]
        assert target["speedup"] == 1.0 and target["speedup_median"] == 1.0
        assert target["acceptance"] == 0.0 and target["mean_accepted_len"] == 1.0


def test_ranked_by_speedup_not_acceptance(bench):
    for entries in groups(bench["report"]).values():
        ranked = sorted(entries, key=lambda e: e["rank"])
        assert [e["rank"] for e in ranked] == list(range(1, N_CONFIGS + 1))
        speedups = [e["speedup"] for e in ranked]
        assert speedups == sorted(speedups, reverse=True)


def test_drafting_statistics(bench):
    for e in bench["report"]["configs"]:
        if e["spec"] == "draft":
            assert 0 < e["acceptance"] <= 1 and 1 < e["mean_accepted_len"] <= 1 + e["draft_max"]
            assert len(e["acceptance_by_position"]) == e["draft_max"]
            assert e["memory_bytes"] > [x for x in bench["report"]["configs"] if x["spec"] == "none"][0]["memory_bytes"]
        if e["spec"] != "none":
            assert e["n_generated"] == e["n_runs"] * 12  # --ignore-eos: every run makes exactly -n tokens


def test_runs_interleaved_in_rotating_order(bench):
    runs = bench["report"]["runs"]
    assert len(runs) == 2 * 8 * N_CONFIGS  # repeats x (prompts x temperatures) x configurations
    blocks = [runs[i:i + N_CONFIGS] for i in range(0, len(runs), N_CONFIGS)]
    order = [r["config"] for r in blocks[0]]
    assert len(set(order)) == N_CONFIGS
    for b, block in enumerate(blocks):
        assert len({(r["workload"], r["temperature"], r["prompt_index"]) for r in block}) == 1  # one prompt
        repeat, job = divmod(b, 8)
        shift = (job + repeat) % N_CONFIGS
        assert [r["config"] for r in block] == order[shift:] + order[:shift]


def test_recommendation_memory_machine(bench):
    report = bench["report"]
    rec = report["recommendation"]
    assert {"name", "flags", "speedup", "acceptance", "reason", "text", "best_by_group"} <= set(rec)
    best_overall = max(rec["overall"], key=lambda e: e["speedup"])
    assert rec["name"] == best_overall["name"]
    assert f"recommendation: {rec['text']}" in bench["stdout"]
    mem = report["memory"]
    assert mem["target"]["kv_bytes"] == pytest.approx(256 * 512, rel=0.05)  # llama.cpp logs 0.01 MiB steps
    assert mem["target"]["weights_bytes"] > 0 and mem["target"]["compute_bytes"] > 0
    assert list(mem["drafts"]) == [str(report["settings"]["drafts"][0])]
    assert {"cpu_count", "llama_cpp_python", "specserve", "platform"} <= set(report["machine"])


def test_table_and_plot(bench):
    assert "ranked by speed after the prompt" in bench["stdout"] and "speedup by workload" in bench["stdout"]
    assert bench["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv, message", [
    (["--draft-max", "0"], "--draft-max and --ngram-max values must be in [1, 64]"),
    (["--repeat", "0"], "--repeat must be > 0"),
    (["--workload", "no-such-workload"], "neither a built-in name"),
    (["--spec", "draft"], "--spec draft needs a draft model"),
])
def test_bad_values_exit_2(capsys, tiny_paths, argv, message):
    code, out = run_cli("bench", "-m", tiny_paths["target"], *argv)
    assert code == 2 and out == ""
    assert message in capsys.readouterr().err


def test_auto_fresh_runs_each_request_as_a_new_process_would(tiny_paths, tmp_path, monkeypatch):
    """auto-fresh plans from a controller loaded from the profile the warm one would save, calibrated;
    what it learns is dropped: the warm controller is the same object with the same state after."""
    from specserve.backends import load_model
    from specserve.bench import LocalModels
    from specserve.bench.runner import BenchConfig, fresh_controller
    from specserve.bench.workloads import BenchPrompt
    from specserve.config import SamplingParams

    monkeypatch.setenv("SPECSERVE_AUTO_PROFILE", "1")
    monkeypatch.setenv("SPECSERVE_HOME", str(tmp_path / "models"))
    target = load_model(str(tiny_paths["target"]), 0, 1)
    draft = load_model(str(tiny_paths["draft_close"]), 0, 1)
    local = LocalModels(target, {"d": draft}, 256, auto_profile=True)
    try:
        prompt = BenchPrompt("w", 0, ({"role": "user", "content": PROMPTS[0]},), chat=False)
        sampling = SamplingParams(max_tokens=16, ignore_eos=True)
        local.run(BenchConfig("auto", "auto", "d", 4), prompt, sampling, "gumbel")
        engine = local.slots["d"].engine
        own, before = engine.controller, json.dumps(engine.controller.state_dict(), sort_keys=True)
        with fresh_controller(engine) as fresh:
            assert fresh is engine.controller and fresh is not own and fresh.profile.loaded
            # what own learnt: each pass length's estimate (the fits weigh a loaded one as at most 4 passes, so
            # where noisy timings made them pool, the fitted tables differ by design)
            ema = lambda c: {n: e for n, e, *_ in c.costs.verify.state()["passes"]}  # noqa: E731
            assert ema(fresh) == pytest.approx(ema(own), rel=1e-9)
        stats, _ = local.run(BenchConfig("auto-fresh", "auto-fresh", "d", 4), prompt, sampling, "gumbel")
        assert stats["n_generated"] == 16
        assert engine.controller is own and json.dumps(own.state_dict(), sort_keys=True) == before
    finally:
        local.close()
        target.close()
        draft.close()
