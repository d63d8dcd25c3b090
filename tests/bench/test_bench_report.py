"""Benchmark arithmetic on hand-made runs: paired speedups, ranking, the recommendation; workloads; seeds."""
from __future__ import annotations

import json
import math

import pytest

from specserve.bench import BenchPlan, Measurement, load_workload, plan_configs, recommend, summarize
from specserve.bench.workloads import BUILTIN_WORKLOADS, SPEC_BENCH_CATEGORIES

# target 100 and 50 tok/s on two prompts. "big" accepts more but is slower; "small" is the fastest.
SPEEDS = {"target": (100, 50), "draft[big] k=4": (110, 55), "draft[small] k=4": (140, 70), "ngram k=4": (80, 45)}
ACCEPTED = {"draft[big] k=4": 78, "draft[small] k=4": 70, "ngram k=4": 20}  # of 100 drafted per run


def measurements(speeds: dict[str, tuple]) -> list[Measurement]:
    out = []
    for name, per_prompt in speeds.items():
        for i, tps in enumerate(per_prompt):
            drafted = 100 if name in ACCEPTED else 0
            stats = {"tokens_per_s": tps, "time_to_first_token_s": 0.1, "n_generated": 128,
                     "n_drafted": drafted, "n_accepted": ACCEPTED.get(name, 0), "n_passes": 40,
                     "drafted_by_position": [drafted // 4] * 4 if drafted else [],
                     "accepted_by_position": [ACCEPTED.get(name, 0) // 4] * 4 if drafted else []}
            out.append(Measurement(name, "w", 0.0, i, 0, stats))
    return out


def configs():
    return plan_configs(["draft", "ngram"], ["big", "small"], [4], [])


def test_paired_speedup_is_geometric_mean_of_per_prompt_ratios():
    speeds = {**SPEEDS, "ngram k=4": (50, 100)}  # 0.5x and 2x: geometric mean 1, arithmetic 1.25
    entries = [e for e in summarize(configs(), measurements(speeds), {}) if e["workload"] == "all"]
    by_name = {e["name"]: e for e in entries}
    assert math.isclose(by_name["ngram k=4"]["speedup"], 1.0)
    assert math.isclose(by_name["draft[small] k=4"]["speedup"], 1.4)
    assert by_name["target"]["speedup"] == 1.0
    assert by_name["draft[big] k=4"]["acceptance"] == 0.78
    assert by_name["draft[big] k=4"]["mean_accepted_len"] == 1 + 78 / 40
    assert by_name["draft[big] k=4"]["acceptance_by_position"] == [0.76] * 4  # 19 of 25 at each position


def test_recommends_fastest_and_names_the_higher_acceptance_loser():
    results = measurements(SPEEDS)
    rec = recommend(configs(), results, summarize(configs(), results, {}))
    assert rec["name"] == "draft[small] k=4" and rec["flags"] == "--spec draft -md small --draft-max 4"
    assert rec["text"].startswith("--spec draft -md small --draft-max 4: 1.40x")
    assert "draft[big] k=4 accepts more (78% vs 70%) but is 1.10x end-to-end" in rec["reason"]


def test_recommends_target_alone_when_nothing_beats_it():
    slow = {name: (90, 45) if name != "target" else (100, 50) for name in SPEEDS}
    results = measurements(slow)
    rec = recommend(configs(), results, summarize(configs(), results, {}))
    assert rec["flags"] == "--spec none" and "no configuration beats it" in rec["reason"]


def test_plan_configs_order_and_flags():
    names = [(c.name, c.flags) for c in plan_configs(["draft", "ngram", "auto"], ["/m/small.gguf"], [2, 8],
                                                      ["http://h:1"])]
    assert names == [
        ("target", "--spec none"),
        ("draft[small] k=2", "--spec draft -md /m/small.gguf --draft-max 2"),
        ("ngram k=2", "--spec ngram --draft-max 2"),
        ("draft[small] k=8", "--spec draft -md /m/small.gguf --draft-max 8"),
        ("ngram k=8", "--spec ngram --draft-max 8"),
        ("auto[small] k<=8", "--spec auto -md /m/small.gguf --draft-max 8"),
        ("endpoint http://h:1", "--endpoint http://h:1"),
    ]


def test_ngram_lengths_of_their_own():
    names = [c.name for c in plan_configs(["draft", "ngram", "auto"], ["small"], [2, 4], [], ngram_maxes=[32])]
    assert names == ["target", "draft[small] k=2", "draft[small] k=4", "ngram k=32", "auto[small] k<=32"]


def test_draft_names_stay_unique():
    names = [c.name for c in plan_configs(["draft"], ["a/m.gguf", "b/m.gguf"], [4], [])]
    assert names == ["target", "draft[a/m.gguf] k=4", "draft[b/m.gguf] k=4"]


def test_seeds_fixed_per_prompt():
    prompts = load_workload("code-edit", 3)
    plan = BenchPlan(plan_configs([], [], [1], []), prompts, [0.8], 64, seed=5)
    seeds = [plan.sampling(0.8, p).seed for p in prompts]
    assert len(set(seeds)) == 3  # different prompts, different seeds
    assert seeds == [BenchPlan(plan.configs, prompts, [0.8], 64, seed=5).sampling(0.8, p).seed for p in prompts]
    assert seeds != [BenchPlan(plan.configs, prompts, [0.8], 64, seed=6).sampling(0.8, p).seed for p in prompts]


@pytest.mark.parametrize("name", BUILTIN_WORKLOADS)
def test_builtin_workloads_load(name):
    prompts = load_workload(name, 10)
    assert len(prompts) == (8 if name == "code-edit-long" else 10)
    assert all(p.messages[-1]["role"] == "user" and p.text for p in prompts)
    if name in SPEC_BENCH_CATEGORIES:
        assert {p.category for p in prompts} == {name}


def test_code_edit_is_input_grounded():
    prompts = load_workload("code-edit", 100)
    assert 10 <= len(prompts) <= 20
    assert all("```" in p.text and p.category == "code-edit" for p in prompts)


def test_long_code_edits_ask_for_the_whole_file_back():
    prompts = load_workload("code-edit-long", 100)
    assert len(prompts) == 8 and {p.workload for p in prompts} == {"code-edit-long"}
    for p in prompts:
        code = p.text.split("```")[1]
        assert p.category == "code-edit-long" and "return the complete" in p.text and code.count("\n") >= 35


def test_spec_bench_mix_spreads_over_categories():
    assert len({p.category for p in load_workload("spec-bench", 13)}) == 13


def test_jsonl_workload(tmp_path):
    path = tmp_path / "mine.jsonl"
    rows = [{"prompt": "a"}, {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "b"}],
                              "temperature": 0.5, "max_tokens": 7, "category": "x"}, {"prompt": "c"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    prompts = load_workload(str(path), 10)
    assert [p.text for p in prompts] == ["a", "b", "c"] and prompts[0].workload == "mine"
    assert (prompts[1].temperature, prompts[1].max_tokens, prompts[1].category) == (0.5, 7, "x")
    plan = BenchPlan(plan_configs([], [], [1], []), prompts, None, None)
    assert [t for t, _ in plan.jobs] == [0.0, 0.5, 0.0]  # the file's own temperature without --temp
    assert plan.sampling(0.5, prompts[1]).max_tokens == 7 and plan.sampling(0.0, prompts[0]).max_tokens == 128
    assert [p.text for p in load_workload(str(path), 2)] == ["a", "b"]


@pytest.mark.parametrize("line, message", [
    ("not json", "not JSON"), ('{"text": "x"}', "needs a non-empty 'prompt'"),
    ('{"prompt": "x", "temperature": -1}', "temperature must be"), ('{"prompt": "x", "max_tokens": 0}', "max_tokens"),
])
def test_jsonl_errors_name_the_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=message):
        load_workload(str(path), 5)


def test_an_endpoint_that_drafts_without_passes_renders():
    """llama-server reports drafted and accepted tokens but no passes: its row has no tau, and no crash."""
    from specserve.bench.table import _row

    e = {"n_drafted": 40, "acceptance": 0.5, "mean_accepted_len": None, "memory_bytes": 0, "rank": 1,
         "name": "endpoint http://x", "tokens_per_s": 10.0, "speedup": 2.0, "speedup_e2e": 1.5, "ttft_s": 0.1}
    row = _row(e, 20)
    assert row.split()[5:8] == ["1.50x", "50.0%", "-"]


def test_the_e2e_speedup_counts_every_configurations_wait_to_the_last_token_alike():
    """A draft model that decodes 1.4x faster but takes 2 s of its own prompt before the first token
    (which the tok/s after the prompt of an --endpoint never sees): to the last token, 128 tokens after
    a 1 s prompt, it is 2.28 s sooner on a 12.8 s answer and 1.2x, not 1.4x, and the target alone 1."""
    runs = []
    for name, tps, before in (("target", 10.0, 1.0), ("draft[small] k=4", 14.0, 3.0)):
        for i in range(2):
            runs.append(Measurement(name, "w", 0.0, i, 0, {
                "tokens_per_s": tps, "time_to_first_token_s": before, "n_generated": 128,
                "t_last_token_s": before + 128 / tps, "n_drafted": 0, "n_accepted": 0, "n_passes": 128}))
    cs = plan_configs(["draft"], ["small"], [4], [])
    by_name = {e["name"]: e for e in summarize(cs, runs, {}) if e["workload"] == "all"}
    assert by_name["target"]["speedup_e2e"] == 1.0
    assert by_name["draft[small] k=4"]["speedup"] == pytest.approx(1.4)
    assert by_name["draft[small] k=4"]["speedup_e2e"] == pytest.approx((1 + 12.8) / (3 + 128 / 14), rel=1e-3)
    # in-process runs carry no client clock: their time from the prompt to the last token (t_total_s)
    for m in runs:
        m.stats["t_total_s"] = m.stats.pop("t_last_token_s")
    assert {e["name"]: e["speedup_e2e"] for e in summarize(cs, runs, {}) if e["workload"] == "all"} == \
        {n: e["speedup_e2e"] for n, e in by_name.items()}


def test_a_workload_at_another_temperature_has_no_cells_at_this_one():
    """`--workload code-edit writing@0.8`: code edits run at 0, stories at 0.8. No table shows a 0.00x for the pairs
    that never ran, and the recommendation names none of them."""
    from specserve.bench.table import workload_matrix

    runs = [Measurement(m.config, "code-edit", 0.0, m.prompt_index, 0, m.stats) for m in measurements(SPEEDS)]
    runs += [Measurement(m.config, "writing@0.8", 0.8, m.prompt_index, 0, m.stats) for m in measurements(SPEEDS)]
    entries = summarize(configs(), runs, {})
    assert {(e["workload"], e["temperature"]) for e in entries} == {("code-edit", 0.0), ("all", 0.0),
                                                                    ("writing@0.8", 0.8), ("all", 0.8)}
    assert all(e["n_runs"] > 0 for e in entries)
    text = "\n".join(workload_matrix(entries))
    assert "0.00x" not in text and " -" in text
    assert "0.00x" not in recommend(configs(), runs, entries)["text"]
