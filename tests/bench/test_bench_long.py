"""Long-prompt workloads (long-file[:N], long-chat[:N]) and `bench --draft-ctx LIST`: draft windows side by
side through the bench's own servers, with the time to the first token and the decode speed after it."""
from __future__ import annotations

import json
import re

import pytest

from specserve.bench.long_prompts import CHARS_PER_TOKEN
from specserve.bench.workloads import load_workload
from bench_runs import run_cli


def _file(prompt) -> str:
    return re.search(r"```python\n(.*)```", prompt.messages[0]["content"], re.S).group(1)


def test_long_file_cuts_each_file_at_a_line_end_near_n_tokens_and_keeps_the_edited_function():
    prompts = load_workload("long-file:1000", 50)
    assert [p.category for p in prompts] == ["edit", "question"] * 6
    for p in prompts:
        text = _file(p)
        assert 0.9 * 1000 * CHARS_PER_TOKEN < len(text) <= 1000 * CHARS_PER_TOKEN and text.endswith("\n")
        if p.category == "edit":  # what it asks to change is in what is sent: `Class.method` or `function`
            name = re.search(r"`([\w.]+)`", p.text.rsplit("```", 1)[1]).group(1).rsplit(".", 1)[-1]
            assert f"def {name}(" in text, name
    whole = load_workload("long-file", 50)
    assert sorted(len(_file(p)) for p in whole[::2]) == [6351, 9656, 11496, 11786, 12473, 13439]


def test_long_chat_re_sends_its_own_answers():
    prompts = load_workload("long-chat:2000", 6)
    assert [p.answers_needed for p in prompts] == [[], [0], [0, 1], [], [3], [3, 4]]
    assert [p.category for p in prompts[:3]] == ["question", "edit", "follow-up"]
    assert len(_file(prompts[0])) <= (2000 - 400) * CHARS_PER_TOKEN


@pytest.mark.parametrize("name", ["long-file:lots", "long-chat:100"])
def test_a_bad_length_is_refused(name):
    with pytest.raises(ValueError, match=name):
        load_workload(name, 4)


@pytest.mark.server
def test_bench_runs_each_draft_window_through_a_server_of_its_own(tiny_paths, tmp_path):
    code, out = run_cli("bench", "-m", tiny_paths["target"], "-md", tiny_paths["draft_close"], "-c", 4096, "-t", 1,
                        "--workload", "long-file:300", "--prompts-per-workload", 2, "-n", 24, "--ignore-eos",
                        "--spec", "draft", "--draft-max", 4, "--draft-ctx", "128,0", "-np", 1, "--no-progress",
                        "--json", tmp_path / "out.json")
    assert code == 0, out
    report = json.loads((tmp_path / "out.json").read_text())
    entries = {e["name"]: e for e in report["configs"] if e["workload"] == "all"}
    assert set(entries) == {"target", "draft[draft_close@ctx128] k=4", "draft[draft_close@ctx0] k=4"}
    runs = [r for r in report["runs"] if r["config"] != "target"]
    assert all(r["stats"]["n_prompt"] > 600 and r["stats"]["n_accepted"] > 0 for r in runs)  # prompts past the window
    by_prompt = {}
    for r in runs:  # greedy: the same text whatever the window
        by_prompt.setdefault(r["prompt_index"], set()).add(r["stats"]["n_generated"])
    assert all(len(v) == 1 for v in by_prompt.values())
    for e in entries.values():
        assert e["ttft_s"] > 0 and e["decode_tokens_per_s"] > 0
    assert any(re.search(r"ttft s\s+decode", line) for line in out.splitlines())  # the table's new column
