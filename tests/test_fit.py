"""--fit (fit.py, cli/fitting.py): the context and GPU layers that fit a GPU budget, from GGUF headers alone.

The models are headers with real shapes (header_models.py): the seed's pair, Qwen3-14B at Q5_K_M (10.5 GB) and
Qwen3-0.6B at Q8_0. Every choice is checked to fit, and to be the most that fits: one step more (256 tokens of
context, one layer) must not.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from header_models import QWEN3_0_6B, QWEN3_14B_Q5_K_M, write_header_only
from specserve.backends import devices
from specserve.cli import main
from specserve.fit import FIT_CTX_DEFAULT, FitError, Model, fit

GiB = 1 << 30


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("fit")
    return (str(write_header_only(d / "qwen3-14b-q5_k_m.gguf", QWEN3_14B_Q5_K_M)),
            str(write_header_only(d / "qwen3-0.6b-q8_0.gguf", QWEN3_0_6B)))


@pytest.fixture(autouse=True)
def no_repack(monkeypatch):
    monkeypatch.setenv("SPECSERVE_EXTRA_BUFFERS", "0")  # as on a GPU: no repacked copy of the CPU's weights


def models(pair, window=4096, ngl=None, ngld=None):
    return Model.from_gguf(pair[0], 512, ngl), Model.from_gguf(pair[1], 64, ngld, window)


def gpu(target, draft, n_ctx, ngl, ngld, n_seq=1):
    return target.split(n_ctx, ngl, n_seq).gpu + draft.split(n_ctx, ngld, n_seq).gpu


def test_the_header_is_the_size_of_the_published_q5_k_m(pair):
    target, draft = models(pair)
    assert round(target.shape.weights_bytes / 1e9, 2) == 10.51  # Qwen3-14B-Q5_K_M.gguf: 10.5 GB
    assert (target.all_layers, draft.all_layers, target.shape.n_ctx_train) == (41, 29, 40960)


def test_everything_fits_at_the_training_context(pair):
    target, draft = models(pair)
    got = fit(target, draft, 40 * GiB)
    assert (got.n_ctx, got.n_gpu_layers, got.n_gpu_layers_draft, got.changed) == (40960, 41, 29, ())
    assert got.gpu == gpu(target, draft, 40960, 41, 29) <= 40 * GiB
    assert got.splits["target"].ram == target.weights.input  # only the token embeddings stay in RAM
    assert fit(target, draft, 40 * GiB, n_ctx=8192).n_ctx == 8192  # -c given: kept


@pytest.mark.parametrize("budget, n_seq, windowed, whole, alone", [
    (23 * GiB, 1, 40960, 38144, 40960),  # a 24 GiB card less the 1 GiB margin, one context: the window keeps the cap
    (23 * GiB, 2, 26112, 18944, 29440),  # serve's default of 2 slots
    (16 * GiB, 1, 24064, 17664, 28672),
])
def test_the_context_shrinks_to_the_largest_that_fits_and_the_window_gives_most_back(pair, budget, n_seq, windowed,
                                                                                       whole, alone):
    target, draft = models(pair)
    got = fit(target, draft, budget, n_seq=n_seq)
    assert (got.n_ctx, got.whole_draft_ctx, got.no_draft_ctx) == (windowed, whole, alone)
    assert (got.n_gpu_layers, got.n_gpu_layers_draft) == (41, 29)  # the context gave way, not the layers
    assert got.gpu == gpu(target, draft, windowed, 41, 29, n_seq) <= budget
    if windowed < 40960:
        assert got.changed == (f"context 40960 -> {windowed}",)
        assert gpu(target, draft, windowed + 256, 41, 29, n_seq) > budget  # the largest that fits
    whole_draft = Model(draft.shape, draft.weights, 64)
    assert fit(target, whole_draft, budget, n_seq=n_seq).n_ctx == whole


def test_fewer_target_layers_where_even_the_least_context_does_not_fit(pair):
    target, draft = models(pair)
    got = fit(target, draft, 10 * GiB)
    assert got.n_ctx == FIT_CTX_DEFAULT and got.n_gpu_layers_draft == 29  # the draft stays whole on the GPU
    assert 0 < got.n_gpu_layers < 41
    assert got.changed == ("context 40960 -> 4096 (--fit-ctx)", f"target layers 41 -> {got.n_gpu_layers}")
    assert got.gpu <= 10 * GiB < gpu(target, draft, 4096, got.n_gpu_layers + 1, 29)
    left = target.weights.input + sum(target.weights.blocks[:41 - got.n_gpu_layers])  # the first blocks stay
    assert got.splits["target"].ram > left  # with their cache, and a compute buffer on the CPU too
    lower = fit(target, draft, 10 * GiB, n_ctx_min=2048)  # --fit-ctx 2048: more context given up, more layers kept
    assert lower.n_ctx == 2048 and lower.n_gpu_layers > got.n_gpu_layers
    above = fit(target, draft, 16 * GiB, n_ctx_min=65536)  # --fit-ctx above the training context: kept
    assert above.n_ctx == 40960 and above.changed == (f"target layers 41 -> {above.n_gpu_layers}",)


def test_nothing_fits_is_refused_with_the_numbers(pair):
    target, draft = models(pair)
    with pytest.raises(FitError) as e:
        fit(target, draft, 2 * GiB)
    said = str(e.value)
    assert said.startswith("nothing fits in 2.0 GiB of GPU memory: at context 4096 (--fit-ctx), the target takes ")
    assert "the target takes 10.3 GiB with 41/41 layers and the draft takes 1.1 GiB with 29/29 layers" in said
    assert said.endswith("the target's output layer alone needs 1006.6 MiB beside 1.1 GiB")


def test_given_layers_are_kept_and_the_rest_fitted(pair):
    target, draft = models(pair, ngl=20)
    got = fit(target, draft, 16 * GiB)  # -ngl 20: the context grows instead
    assert got.n_gpu_layers == 20 and got.n_ctx == 40960 and got.changed == ()
    target, draft = models(pair, ngl=-1)  # -ngl all, at a budget where only fewer layers would fit
    got = fit(target, draft, 10.5 * GiB)
    assert got.n_gpu_layers == 41 and got.n_ctx == 4096 and 0 <= got.n_gpu_layers_draft < 29  # the draft gave way
    assert got.gpu <= 10.5 * GiB < gpu(target, draft, 4096, 41, got.n_gpu_layers_draft + 1)
    with pytest.raises(FitError, match="the target takes .* with 41/41 layers, -ngl given"):
        fit(target, draft, 8 * GiB)  # the target's given layers alone do not fit
    target, draft = models(pair, ngl=-1, ngld=-1)
    with pytest.raises(FitError, match=r"at context 32768 \(-c\).*-ngld given: .* in all"):
        fit(target, draft, 16 * GiB, n_ctx=32768)  # all given: nothing left to choose


def check(capsys, *argv):
    code = main(["check", "--memory-only", "--fit", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_check_fit_prints_and_returns_the_choice(pair, capsys):
    argv = ("-m", pair[0], "-md", pair[1], "--gpu-budget", "24GiB")
    code, out, _ = check(capsys, *argv, "-np", 2, "--json")
    assert code == 0
    report = json.loads(out)
    got = report["fit"]
    assert (got["n_ctx"], got["n_gpu_layers"], got["n_gpu_layers_draft"], got["n_seq"]) == (26112, 41, 29, 2)
    assert (got["whole_draft_ctx"], got["no_draft_ctx"], got["changed"]) == (18944, 29440, ["context 40960 -> 26112"])
    assert got["budget_bytes"] == 23 * GiB and got["target"]["gpu"] + got["draft"]["gpu"] == got["gpu_bytes"]
    assert got["target"]["ram"] + got["draft"]["ram"] == got["ram_bytes"] > 0
    assert report["memory"]["n_ctx"] == 26112 and report["memory"]["target"]["n_ubatch"] == 512  # a GPU's -ub
    code, text, _ = check(capsys, *argv, "-np", 2)
    assert "  budget 23.0 GiB of GPU memory: 24.0 GiB (--gpu-budget) less --fit-target 1024 MiB" in text
    assert "  chosen: -c 26112 -ngl 41/41 -ngld 29/29 (context 40960 -> 26112)" in text
    assert "29440 without the draft, 26112 with it at its window (--draft-ctx 4096)" in text
    assert "18944 with the draft at the whole context" in text
    code, out, _ = check(capsys, *argv, "-c", 8192, "-ngl", 30, "--fit-target", 2048, "--json")  # given: kept
    got = json.loads(out)["fit"]
    assert (got["n_ctx"], got["n_gpu_layers"], got["budget_bytes"]) == (8192, 30, 22 * GiB)


def test_check_fit_refuses_what_does_not_fit_with_exit_2(pair, capsys):
    code, out, err = check(capsys, "-m", pair[0], "-md", pair[1], "--gpu-budget", "3GiB")
    assert code == 2 and out == ""
    assert err.startswith("specserve: error: --fit: nothing fits in 2.0 GiB of GPU memory: at context 4096")
    assert "or leave out --fit to run on the CPU; budget: 3.0 GiB (--gpu-budget) less --fit-target 1024 MiB)" in err


@pytest.mark.skipif(devices.gpu_offload(), reason="this llama-cpp-python can offload to a GPU")
def test_check_fit_without_a_gpu_or_a_budget_says_so(pair, capsys):
    code, out, _ = check(capsys, "-m", pair[0], "-md", pair[1], "--json")
    assert code == 0 and json.loads(out)["fit"] == {"skipped": "llama.cpp sees no GPU and no --gpu-budget was given"}


@pytest.mark.skipif(devices.gpu_offload(), reason="this llama-cpp-python can offload to a GPU")
def test_generate_fit_on_a_cpu_build_says_so_and_runs_on_the_cpu(tiny_paths):
    r = subprocess.run([sys.executable, "-m", "specserve", "generate", "-m", str(tiny_paths["target"]), "-p", "the cat",
                        "-n", "4", "--ignore-eos", "-t", "1", "-c", "256", "--fit", "--gpu-budget", "24GiB"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines()[0] == ("fit: llama-cpp-python is built for the CPU only: no GPU to fit to; the "
                                        "models run on the CPU at -c 256")
    assert "memory: total" in r.stderr and "at context 256" in r.stderr


def test_serve_fits_its_slots_on_a_gpu(pair, monkeypatch, capsys):
    """serve's flags through to the ModelConfig it loads, on a build that offloads and a GPU of 24 GiB free
    (llama.cpp's device list stood in for): each of -np's slots has a context of its own."""
    import argparse

    from specserve.cli import serve

    monkeypatch.setattr(devices, "gpu_offload", lambda: True)
    monkeypatch.setattr(devices, "list_devices", lambda lib=None: [
        devices.Device("CUDA0", "NVIDIA GeForce RTX 3090", "GPU", free=24 * GiB, total=24 * GiB),
        devices.Device("CPU", "CPU", "CPU", free=64 * GiB, total=64 * GiB)])
    p = argparse.ArgumentParser()
    serve.add_parser(p.add_subparsers())
    for np_, n_ctx in ((2, 26112), (1, 40960)):
        args = p.parse_args(["serve", "-m", pair[0], "-md", pair[1], "--fit", "-np", str(np_)])
        cfg, _ = serve.configs(args)
        assert (cfg.n_ctx, cfg.n_gpu_layers, cfg.n_gpu_layers_draft, cfg.n_ubatch) == (n_ctx, 41, 29, 512)
        line = capsys.readouterr().err.strip()
        assert line.startswith(f"fit: -c {n_ctx} -ngl 41/41 -ngld 29/29") and "CUDA0's free memory" in line
    args = p.parse_args(["serve", "-m", pair[0], "-md", pair[1], "--fit", "off", "-np", "2"])
    assert serve.configs(args)[0].n_ctx == 4096  # --fit off: the flags as given


@pytest.mark.parametrize("flags, msg", [
    (["--fit-target", "-1"], "--fit-target must be >= 0 MiB"),
    (["--fit-ctx", "8"], "--fit-ctx must be >= 16"),
    (["--gpu-budget", "512MiB"], "--fit: no GPU memory to fit to: 512.0 MiB (--gpu-budget) less --fit-target"),
])
def test_bad_fit_values_exit_2(pair, capsys, flags, msg):
    code, _, err = check(capsys, "-m", pair[0], *(flags if "--gpu-budget" in flags else [*flags, "--gpu-budget",
                                                                                          "24GiB"]))
    assert code == 2 and msg in err
