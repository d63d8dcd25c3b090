"""`specserve check`: the pairing verdict, the memory report, and clear refusals of bad input."""
from __future__ import annotations

import json

import pytest

from specserve.cli import main
from tiny_models import write_tiny_model


def check(capsys, *argv) -> tuple[int, str, str]:
    code = main(["check", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def real_model(name: str) -> str:
    """A packaged model's path, pulled first if needed (CI pulls them up front)."""
    from specserve import models

    return str(models.ensure(name))


def test_compatible_tiny_pair_json(capsys, tiny_paths):
    code, out, _ = check(capsys, "-m", tiny_paths["target"], "-md", tiny_paths["draft_close"], "-c", 2048,
                         "--budget", "1GiB", "--json", "-t", 1)
    assert code == 0
    report = json.loads(out)
    assert report["compatible"] is True and report["problems"] == []
    mem = report["memory"]
    assert mem["target"]["kv_per_token"] == 256 and mem["target"]["kv"] == 256 * 2048
    assert mem["draft"]["kv_per_token"] == 256
    assert mem["total_bytes"] == mem["target"]["total"] + mem["draft"]["total"]
    assert mem["draft_cost_bytes"] == mem["draft"]["total"]
    assert mem["max_ctx_in_budget"] == mem["max_ctx_in_budget_without_draft"] == 1024  # capped: n_ctx_train
    measured = mem["measured"]
    assert set(measured) == {"target", "draft", "total_bytes", "relative_error"}
    for role in ("target", "draft"):
        assert measured[role]["kv"] == 256 * 2048
        assert all(abs(e) < 0.10 for e in measured["relative_error"][role].values()), measured["relative_error"]


def test_budget_tradeoff_in_text_report(capsys, tiny_paths):
    code, out, _ = check(capsys, "-m", tiny_paths["target"], "-md", tiny_paths["draft_close"], "-c", 512,
                         "--budget", "13MiB", "-t", 1)
    assert code == 0
    assert "pairing: compatible" in out
    assert "estimated" in out and "measured" in out and "target KV cache (256 B/token)" in out
    # 13 MiB holds the target alone at 1024 tokens (11.6 MiB), the pair only at 512 (12.9 MiB)
    assert "the draft costs" in out and "largest context 1024 -> 512 with the draft" in out


def test_flagrant_pair_exits_2_and_still_reports(capsys, tiny_paths, tmp_path):
    spm = write_tiny_model(tmp_path / "spm.gguf", seed=1, tokenizer_model="llama")
    code, out, _ = check(capsys, "-m", tiny_paths["target"], "-md", spm, "-c", 256, "--no-measure", "-t", 1)
    assert code == 2
    assert "REFUSED" in out and "problem: tokenizer models differ" in out
    assert "memory at context 256" in out  # the memory report is still printed


@pytest.mark.parametrize("flag, value, message", [
    ("--budget", "lots", "cannot read 'lots' as a size"),
    ("--budget", "0GiB", "must be positive"),
    ("-c", "0", "context size must be > 0"),
    ("-c", "-5", "context size must be > 0"),
])
def test_bad_values_one_line_exit_2(capsys, tiny_paths, flag, value, message):
    code, out, err = check(capsys, "-m", tiny_paths["target"], flag, value)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err


def test_refuses_smollm2_with_gemma(capsys):
    target, draft = real_model("smollm2-f16"), real_model("gemma")
    code, out, _ = check(capsys, "-m", target, "-md", draft, "-c", 2048, "--no-measure", "--json")
    assert code == 2
    report = json.loads(out)
    assert report["compatible"] is False
    problems = " | ".join(report["problems"])
    assert "tokenizer models differ" in problems and "vocabulary sizes differ" in problems


@pytest.mark.parametrize("n_ctx", [2048, 8192])
@pytest.mark.parametrize("target, draft", [("smollm2-f16", "smollm2-q4_1"), ("gemma", None)])
def test_estimate_within_10_percent_on_packaged_models(capsys, target, draft, n_ctx):
    argv = ["-m", real_model(target), "-c", n_ctx, "--json"] + (["-md", real_model(draft)] if draft else [])
    code, out, _ = check(capsys, *argv)
    assert code == 0
    errors = json.loads(out)["memory"]["measured"]["relative_error"]
    for role, parts in errors.items():
        for part, e in parts.items():
            assert abs(e) < 0.10, f"{role} {part} at {n_ctx}: {e:+.1%}"
