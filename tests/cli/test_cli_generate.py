"""`specserve generate` as a user runs it: real processes, tiny models, clear errors."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest


def specserve(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "specserve", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def test_generate_json_carries_text_tokens_and_stats(tiny_paths):
    r = specserve("generate", "-m", tiny_paths["target"], "-md", tiny_paths["draft_close"], "--spec", "draft",
                  "-p", "the cat sat on the mat", "-n", "24", "--ignore-eos", "-t", "1", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    stats = out["stats"]
    assert len(out["tokens"]) == stats["n_generated"] == 24
    for key in ("n_prompt", "n_passes", "n_drafted", "n_accepted", "acceptance", "mean_accepted_len",
                "accepted_by_position", "tokens_per_s"):
        assert key in stats
    assert stats["n_drafted"] > 0 and 0 < stats["acceptance"] <= 1
    assert stats["mean_accepted_len"] == pytest.approx(1 + stats["n_accepted"] / stats["n_passes"], abs=1e-3)
    assert stats["n_passes"] < 24  # speculation saved target passes


def test_generate_streams_text_and_prints_stats_to_stderr(tiny_paths):
    r = specserve("generate", "-m", tiny_paths["target"], "--spec", "ngram", "-p", "hello hello hello",
                  "-n", "8", "--ignore-eos", "-t", "1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    assert "generated 8 tok" in r.stderr and "accepted" in r.stderr


def test_same_seed_same_output(tiny_paths):
    args = ("generate", "-m", tiny_paths["target"], "-md", tiny_paths["draft_far"], "--spec", "draft",
            "-p", "once upon a time", "-n", "16", "--temp", "1.0", "--seed", "42", "--ignore-eos", "-t", "1",
            "--json")
    a, b = specserve(*args), specserve(*args)
    assert json.loads(a.stdout)["tokens"] == json.loads(b.stdout)["tokens"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["-m", "/nonexistent/model.gguf", "-p", "x"], "is neither a model name"),
        (["--temp", "-1", "-p", "x"], "temperature must be in [0, 100]"),
        (["--top-p", "1.5", "-p", "x"], "top_p must be in (0, 1]"),
        (["--draft-max", "-2", "-p", "x"], "draft_max must be in"),
        (["-n", "0", "-p", "x"], "max_tokens must be > 0"),
        (["-c", "16", "-p", "word " * 40], "prompt is"),
        (["-f", "/nonexistent/prompt.txt"], "cannot read prompt file"),
    ],
)
def test_errors_are_one_clear_line(tiny_paths, args, message):
    if "-m" not in args:
        args = ["-m", tiny_paths["target"], *args]
    r = specserve("generate", *args)
    assert r.returncode != 0
    assert message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_draft_mode_without_draft_model_is_refused(tiny_paths):
    r = specserve("generate", "-m", tiny_paths["target"], "--spec", "draft", "-p", "x")
    assert r.returncode == 2 and "needs a draft model" in r.stderr
