"""`specserve bench --workload fim-replay`: the replay's requests, and a run on a tiny FIM pair
through the bench's own server and another server's /infill given as --endpoint."""
from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

import pytest

from specserve.bench.fim_workload import FIM_MODULES, KEYSTROKES, fim_replay, module_file
from specserve.cli import main

sys.path.insert(0, str(Path(__file__).parent.parent))
from server_fixtures import ServerProcess  # noqa: E402
from tiny_models import QWEN_FIM, write_tiny_model  # noqa: E402


def test_the_replay_cuts_real_standard_library_files():
    files = fim_replay(len(FIM_MODULES) * 2)
    assert len(files) == len(FIM_MODULES)
    for cases, name in zip(files, FIM_MODULES):
        lines = module_file(name).read_text(encoding="utf-8").splitlines()
        assert cases[0].file == name.replace(".", "/") + ".py"
        for case in cases:
            line = lines[case.line]
            assert case.prompt + case.truth == line and len(case.truth.strip()) > 0
            assert case.prompt[:case.n_indent].strip() == "" and len(case.prompt) == case.n_indent + case.typed
            assert case.prefix.endswith(lines[case.line - 1] + "\n")
            assert case.suffix.startswith("\n" + lines[case.line + 1]) if case.line + 1 < len(lines) else True
            assert case.matches(case.truth + "\nanything after") and not case.matches(case.truth + "x")
        # at each cut the developer types more of the same line: each request extends the one before
        first = [c for c in cases if c.typed == 0]
        assert len(first) == 2 and {c.typed for c in cases} <= set(KEYSTROKES)
        for a, b in zip(cases, cases[1:]):
            if b.line == a.line:
                assert b.prompt.startswith(a.prompt) and b.typed > a.typed


@pytest.fixture(scope="module")
def fim_pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("fim_bench")
    return (write_tiny_model(d / "fim.gguf", seed=1, control_tokens=QWEN_FIM),
            write_tiny_model(d / "fim_draft.gguf", seed=1, noise=0.05, noise_seed=7, control_tokens=QWEN_FIM))


@pytest.mark.server
def test_fim_replay_through_the_bench_server_and_an_infill_endpoint(fim_pair, tmp_path):
    target, draft = fim_pair
    other = ServerProcess(["-m", str(target), "-t", "1", "-c", "2048", "--spec", "none"], tmp_path / "other.log")
    try:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main(["bench", "-m", str(target), "-md", str(draft), "-c", "2048", "-t", "1",
                         "--workload", "fim-replay", "--prompts-per-workload", "2", "-n", "8",
                         "--spec", "draft,ngram", "--draft-max", "3", "--no-progress",
                         "--endpoint", f"other={other.url}", "--json", str(tmp_path / "fim.json")])
    finally:
        assert other.stop() == 0
    assert code == 0
    report = json.loads((tmp_path / "fim.json").read_text())
    rows = {r["config"]: r for r in report["configs"]}
    assert set(rows) == {"target", "draft[fim_draft] k=3", "ngram k=3", "other"}
    n = len(report["runs"]) // 4
    assert n >= 4 and all(r["requests"] == n for r in rows.values())
    for name, row in rows.items():
        assert row["same_as_target"] == 1.0, name  # greedy: every configuration's text is the target alone's
        assert row["p50_ms"] > 0 and row["p95_ms"] >= row["p50_ms"] and 0 <= row["match"] <= 1
        # keystroke requests evaluate only what was typed since the request before (both servers cache)
        assert row["prompt_n_keystroke_mean"] < 10 < row["prompt_n_mean"], name
    assert rows["draft[fim_draft] k=3"]["acceptance"] > 0
    assert "fim-replay" in out.getvalue() and "line match" in out.getvalue()
