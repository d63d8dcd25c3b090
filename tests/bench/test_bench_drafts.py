"""`specserve bench --drafts auto`: every pairable candidate measured end to end, the fastest pinned for the
target (draft_pins.py), and `-md auto` choosing the pinned one after."""
from __future__ import annotations

import argparse
import contextlib
import io
import json

import pytest

from specserve import draft_pins
from specserve.bench.report import ALL
from specserve.cli import main
from specserve.cli.bench import _pin
from specserve.cli.common import auto_draft
from tiny_models import write_tiny_model


@pytest.fixture()
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSERVE_HOME", str(tmp_path / "home" / "models"))  # no packaged candidate; pins here
    d = tmp_path / "models"
    d.mkdir()
    write_tiny_model(d / "target.gguf", seed=1, n_layer=4, n_embd=128, n_ff=256)
    write_tiny_model(d / "small.gguf", seed=1, n_layer=1, n_embd=64, n_ff=128)
    write_tiny_model(d / "medium.gguf", seed=2, n_layer=2, n_embd=64, n_ff=128)
    return d


def args(**kw):
    return argparse.Namespace(**{"ctx_size": 512, "threads": 1, "draft_ctx": 256, "ubatch_size_draft": 16,
                                 "n_gpu_layers": 0, "draft_candidates": [], **kw})


def entry(draft, speedup, workload=ALL):
    return {"workload": workload, "draft_model": draft, "speedup": speedup}


@pytest.mark.parametrize("entries, best", [
    ([entry("small", 1.2), entry("medium", 1.5), entry(None, 1.0)], "medium"),
    ([entry("small", 1.2), entry("small", 1.6), entry("medium", 1.3)], "small"),  # averaged: 1.4 > 1.3
    ([entry("small", 0.9), entry("medium", 0.8)], None),  # none beats the target alone: no pin
    ([entry("small", 2.0, workload="code-edit"), entry("medium", 1.1)], "medium"),  # over every prompt only
])
def test_the_winner_is_the_fastest_that_beats_the_target_alone(entries, best):
    assert draft_pins.winner(entries, ALL)[0] == best


def test_a_pin_puts_its_draft_first_until_its_file_changes(folder, capsys):
    target = str(folder / "target.gguf")
    assert auto_draft(args(), target).chosen.name == "small"  # the cheapest
    paths = {"small": str(folder / "small.gguf"), "medium": str(folder / "medium.gguf")}
    _pin(args(), target, paths, [entry("small", 1.1), entry("medium", 1.4)])
    assert "drafts: pinned medium for target.gguf" in capsys.readouterr().err
    assert draft_pins.pins_path().is_file() and draft_pins.pinned(target, 1) == paths["medium"]
    choice = auto_draft(args(), target)
    assert choice.chosen.name == "medium" and choice.chosen.pinned and "pinned by" in choice.reason
    assert draft_pins.pinned(target, 2) is None  # another thread count: measured for 1 only
    write_tiny_model(folder / "medium.gguf", seed=3, n_layer=2, n_embd=64, n_ff=128)  # replaced in place
    assert draft_pins.pinned(target, 1) is None and auto_draft(args(), target).chosen.name == "small"


def test_nothing_pinned_when_no_draft_beats_the_target(folder, capsys):
    _pin(args(), str(folder / "target.gguf"), {"small": str(folder / "small.gguf")}, [entry("small", 0.7)])
    assert "none beat the target alone (small 0.70x): nothing pinned" in capsys.readouterr().err
    assert not draft_pins.pins_path().exists()


def test_bench_drafts_auto_measures_every_candidate(folder, tmp_path, capsys):
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"prompt": "Once upon a time", "category": "toy"}) + "\n")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["bench", "-m", str(folder / "target.gguf"), "--drafts", "auto", "-c", "512", "-t", "1",
                     "--workload", str(workload), "--prompts-per-workload", "1", "-n", "8", "--ignore-eos",
                     "--draft-max", "2", "--via", "inprocess", "--no-progress", "--json", str(tmp_path / "r.json")])
    assert code == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["settings"]["drafts"] == ["small", "medium"] and report["settings"]["spec"] == ["draft"]
    measured = {e["draft_model"] for e in report["configs"] if e["workload"] == ALL}
    assert measured == {None, "small", "medium"}  # the target alone beside each candidate
    err = capsys.readouterr().err
    assert "draft: small: the cheapest of 2 pairable candidate(s)" in err
    assert ("drafts: pinned" in err) == draft_pins.pins_path().is_file()
    assert "drafts: pinned" in err or "nothing pinned" in err
