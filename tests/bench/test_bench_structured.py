"""The `structured` workload: prompts with JSON Schemas, run constrained (and unconstrained for
comparison), each configuration's share of outputs that validate in the report."""
from __future__ import annotations

import contextlib
import io
import json

import pytest

from specserve.bench.structured import validates
from specserve.bench.workloads import load_workload
from specserve.cli import main


def test_structured_workload_carries_schemas():
    prompts = load_workload("structured", 100)
    assert len(prompts) >= 20 and all(p.schema and p.constrain for p in prompts)
    cats = {p.category for p in prompts}
    assert {"extraction", "classification", "nested", "tool"} <= cats
    assert sum(p.category == "tool" for p in prompts) >= 2
    free = load_workload("structured:unconstrained", 3)
    assert [p.schema for p in free] == [p.schema for p in load_workload("structured", 3)]
    assert not any(p.constrain for p in free) and free[0].workload == "structured:unconstrained"


def test_validates():
    schema = {"type": "object", "properties": {"a": {"type": "integer", "maximum": 3}}, "required": ["a"]}
    assert validates('{"a": 2}', schema) and validates(' {"a": 2}\n', schema)
    assert not validates('{"a": 5}', schema) and not validates('{"a": 2', schema) and not validates("", schema)


SHORT = {"type": "object", "properties": {"label": {"type": "string", "enum": ["cat", "dog"]},
                                          "n": {"type": "integer", "minimum": 0, "maximum": 99}},
         "required": ["label", "n"], "additionalProperties": False}


def test_bench_reports_validity_constrained_and_not(tiny_paths, tmp_path):
    """Schemas whose outputs are short (the tiny model would fill an unbounded string to max_tokens)."""
    workload = tmp_path / "short.jsonl"
    workload.write_text("".join(json.dumps({"prompt": p, "schema": SHORT}) + "\n"
                                for p in ("the cat sat on the mat", "a dog ran")))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([str(a) for a in ("bench", "-m", tiny_paths["target"], "-md", tiny_paths["draft_close"], "-c", 1024,
                                      "-t", 1, "--workload", workload, f"{workload}:unconstrained",
                                      "--prompts-per-workload", 2, "-n", 40, "--spec", "none,draft,auto",
                                      "--temp", 0, "--via", "inprocess", "--no-progress", "--json",
                                      tmp_path / "out.json")])
    assert code == 0
    report = json.loads((tmp_path / "out.json").read_text())
    by = {(e["name"], e["workload"]): e for e in report["configs"]}
    constrained = [e for (name, w), e in by.items() if w == "short"]
    # the tiny model writes valid JSON under a grammar
    assert constrained and all(e["valid"] == 1.0 for e in constrained)
    assert all(e["grammar_ms_per_token"] > 0 for e in constrained)
    free = [e for (name, w), e in by.items() if w.endswith(":unconstrained")]
    assert free and all(e["valid"] is not None and e["grammar_ms_per_token"] is None for e in free)
    assert "structured output: outputs that parse and validate" in out.getvalue()


@pytest.mark.server
def test_the_served_bench_reports_grammar_time(tiny_paths, tmp_path):
    """Through the bench's own server: the server's grammar time (usage.speculative.grammar_s) per token
    and as a share of its decode time, in the structured table as in-process runs have it."""
    workload = tmp_path / "short.jsonl"
    workload.write_text(json.dumps({"prompt": "the cat sat on the mat", "schema": SHORT}) + "\n")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([str(a) for a in ("bench", "-m", tiny_paths["target"], "-md", tiny_paths["draft_close"], "-c", 512,
                                      "-t", 1, "--workload", workload, "--prompts-per-workload", 1, "-n", 40,
                                      "--spec", "none,draft", "--draft-max", 3, "--temp", 0,
                                      "--via", "server", "-np", 1,
                                      "--no-progress", "--json", tmp_path / "out.json")])
    assert code == 0
    report = json.loads((tmp_path / "out.json").read_text())
    served = [e for e in report["configs"] if e["workload"] == "short"]
    assert len(served) == 2 and all(e["via"] == "server" for e in served)
    for e in served:
        assert e["grammar_ms_per_token"] > 0 and 0 < e["grammar_share"] < 1, e
    rows = [line for line in out.getvalue().splitlines() if " short " in line and line.endswith("%")]
    assert len(rows) == 2 and all(line.split()[-2] != "-" for line in rows), out.getvalue()
