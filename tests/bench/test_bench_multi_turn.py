"""The multi-turn benchmark workload: conversations that re-send each configuration's own answers,
a cross-request scope per configuration, and the first-turn vs later-turn report."""
from __future__ import annotations

import math

from specserve.bench import BenchPlan, Measurement, load_workload, plan_configs, run_benchmark, summarize_turns
from specserve.bench.runner import WARMUP_MESSAGES
from specserve.bench.table import turn_table
from specserve.bench.workloads import FOLLOW_UPS, TURNS, resolve_messages
from bench_runs import FakeLocal


def test_conversations_retry_then_edit_their_own_answers():
    prompts = load_workload("multi-turn", 8)
    assert [p.turn for p in prompts] == list(TURNS) * 2 and [p.index for p in prompts] == list(range(8))
    first, retry, rename, docstring = prompts[:4]
    assert retry.messages == first.messages and first.category == "first"
    assert rename.answers_needed == [0] and docstring.answers_needed == [0, 2]
    filled = resolve_messages(docstring, {0: "A0", 2: "A2"})
    assert [m["role"] for m in filled] == ["user", "assistant", "user", "assistant", "user"]
    assert [filled[1]["content"], filled[3]["content"]] == ["A0", "A2"]
    assert filled[2]["content"] == FOLLOW_UPS[0][1] and filled[4]["content"] == FOLLOW_UPS[1][1]
    assert prompts[4].text != first.text  # the second conversation asks another coding question
    assert len(load_workload("multi-turn", 6)) == 6  # the first 6 requests of 2 conversations


def test_each_configuration_re_sends_its_own_answers_in_its_own_scope():
    configs = plan_configs(["ngram", "suffix"], [], [4], [])
    prompts = load_workload("multi-turn", 4)
    local = FakeLocal()
    results = run_benchmark(BenchPlan(configs, prompts, [0.0], 8, repeat=2), local, {}, progress=False)
    assert len(results) == len(configs) * 4 * 2 and {m.turn for m in results} == set(TURNS)
    warmups, runs = local.calls[:len(configs)], local.calls[len(configs):]
    assert all(m == list(WARMUP_MESSAGES) and scope is None for _, _, m, scope in warmups)  # no conversation seen
    for name, index, messages, scope in runs:
        if index == 3:  # docstring: its own first answer and its own rename answer
            assert [messages[1]["content"], messages[3]["content"]] == [f"{name}:0", f"{name}:2"]
        assert (scope is not None) == name.startswith("suffix")
    scopes = {scope for name, _, _, scope in runs if scope}
    assert len(scopes) == 2  # one per repeat: a repeat's first turn is new to its store


def test_turn_report_pairs_each_turn_with_the_target():
    configs = plan_configs(["suffix"], [], [4], [])
    speeds = {"target": (100, 100, 100, 100), configs[1].name: (100, 400, 200, 200)}
    results = [Measurement(name, "multi-turn", 0.0, i, 0, {"tokens_per_s": v, "n_drafted": 10, "n_accepted": 5,
                                                           "n_passes": 5}, TURNS[i])
               for name, per_turn in speeds.items() for i, v in enumerate(per_turn)]
    turns = summarize_turns(configs, results)
    got = {(e["name"], e["turn"]): e["speedup"] for e in turns}
    suffix = configs[1].name
    assert got[(suffix, "first")] == 1.0 and got[(suffix, "retry")] == 4.0 and got[("target", "later")] == 1.0
    assert math.isclose(got[(suffix, "later")], (4 * 2 * 2) ** (1 / 3), rel_tol=1e-4)
    text = "\n".join(turn_table(turns))
    assert "first" in text and "later" in text and "4.00x" in text
    assert summarize_turns(configs, [Measurement("target", "w", 0.0, 0, 0, {"tokens_per_s": 1.0})]) == []


def test_twice_sends_each_prompt_then_the_same_request_again():
    prompts = load_workload("code-edit:twice", 4)
    assert [p.turn for p in prompts] == ["first", "retry", "first", "retry"]
    assert [p.index for p in prompts] == [0, 1, 2, 3]
    assert prompts[0].messages == prompts[1].messages != prompts[2].messages == prompts[3].messages
    assert prompts[0].messages == load_workload("code-edit", 2)[0].messages
    assert {p.workload for p in prompts} == {"code-edit:twice"} and len(load_workload("qa:twice", 3)) == 3


def test_again_sends_the_same_requests_after_the_runs_other_workloads():
    """`NAME:again`: a repeat with other requests between it and its first pass, as a retry or an agent's
    resent turn comes in use; each configuration's repeat finds its own first answer in its own scope."""
    prompts = [*load_workload("code-edit:again", 4), *load_workload("coding", 2)]
    assert [p.turn for p in prompts] == ["first", "first", "again", "again", "", ""]
    assert prompts[0].messages == prompts[2].messages != prompts[1].messages == prompts[3].messages
    configs = plan_configs(["suffix"], [], [4], [])
    local = FakeLocal()
    results = run_benchmark(BenchPlan(configs, prompts, [0.0], 8), local, {}, progress=False)
    runs = [(index, scope) for name, index, _, scope in local.calls[len(configs):] if name.startswith("suffix")]
    workloads = [m.workload for m in results if m.config == "target"]
    assert workloads == ["code-edit:again"] * 2 + ["coding"] * 2 + ["code-edit:again"] * 2  # the repeats last
    assert [index for index, _ in runs] == [0, 1, 0, 1, 2, 3] and len({scope for _, scope in runs}) == 1
    turns = {(e["name"], e["turn"]) for e in summarize_turns(configs, results)}
    assert ("target", "again") in turns and ("target", "later") in turns
