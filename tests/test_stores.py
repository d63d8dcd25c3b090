"""Model discovery (stores.py): --models-dir and the Ollama, LM Studio, Hugging Face, llama.cpp stores,
each model named as its tool names it, the broken ones listed with why."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from store_fixtures import fake_gguf, ollama_model

from specserve import stores


def by_name(found):
    return {f.name: f for f in found}


def test_models_dir_files_folders_and_split_parts(tmp_path):
    (tmp_path / "llama-3.2-1b-Q4_K_M.gguf").write_bytes(fake_gguf("a"))
    (tmp_path / "big-00001-of-00002.gguf").write_bytes(fake_gguf("b1"))
    (tmp_path / "big-00002-of-00002.gguf").write_bytes(fake_gguf("b2"))
    gemma = tmp_path / "gemma-3-4b-it-Q8_0"
    gemma.mkdir()
    (gemma / "gemma-3-4b-it-Q8_0.gguf").write_bytes(fake_gguf("g"))
    (gemma / "mmproj-F16.gguf").write_bytes(fake_gguf("p"))  # a projector, not a model
    kimi = tmp_path / "Kimi"
    kimi.mkdir()
    for i in (1, 2, 3):
        (kimi / f"Kimi-IQ1_S-0000{i}-of-00003.gguf").write_bytes(fake_gguf(str(i)))
    (tmp_path / "notes.txt").write_text("not a model")
    found = by_name(stores.discover(tmp_path))
    assert sorted(found) == ["Kimi", "big", "gemma-3-4b-it-Q8_0", "llama-3.2-1b-Q4_K_M"]
    assert all(f.error is None for f in found.values())
    assert found["Kimi"].path.name == "Kimi-IQ1_S-00001-of-00003.gguf"  # llama.cpp opens the first part
    assert found["Kimi"].size == sum(p.stat().st_size for p in kimi.iterdir())
    assert found["big"].path.name == "big-00001-of-00002.gguf"
    assert found["gemma-3-4b-it-Q8_0"].path.name == "gemma-3-4b-it-Q8_0.gguf"


def test_models_dir_missing_split_part_and_non_gguf_listed_failed(tmp_path):
    (tmp_path / "big-00001-of-00003.gguf").write_bytes(fake_gguf())
    (tmp_path / "big-00003-of-00003.gguf").write_bytes(fake_gguf())
    (tmp_path / "html.gguf").write_bytes(b"<!DOCTYPE html>")  # a download that saved an error page
    found = by_name(stores.discover(tmp_path))
    assert "part(s) 2 of 3 missing" in found["big"].error
    assert "not a GGUF file" in found["html"].error


def test_models_dir_not_a_folder(tmp_path):
    with pytest.raises(ValueError, match="not a folder"):
        stores.discover(tmp_path / "nowhere")


def test_ollama_store_names_as_ollama_does(tmp_path):
    root = tmp_path / "ollama"
    ollama_model(root, "qwen2.5-coder:1.5b", fake_gguf("q"))
    ollama_model(root, "smollm2", fake_gguf("s"))  # no tag: latest
    ollama_model(root, "mymodel:q4", fake_gguf("m"), namespace="someone")
    ollama_model(root, "Qwen-GGUF:Q4_K_M", fake_gguf("h"), registry="hf.co", namespace="bartowski")
    found = by_name(stores.discover(stores=["ollama"], env={"OLLAMA_MODELS": str(root)}, home=tmp_path))
    assert sorted(found) == ["hf.co/bartowski/Qwen-GGUF:Q4_K_M", "qwen2.5-coder:1.5b", "smollm2:latest",
                             "someone/mymodel:q4"]
    q = found["qwen2.5-coder:1.5b"]
    assert q.error is None and q.store == "ollama"
    assert q.path.parent == root / "blobs" and q.path.name.startswith("sha256-")
    assert q.path.read_bytes() == fake_gguf("q")
    assert stores.lookup("smollm2", list(found)) == "smollm2:latest"  # `:latest` implied
    assert stores.lookup("qwen2.5-coder:1.5b", list(found)) == "qwen2.5-coder:1.5b"
    assert stores.lookup("qwen2.5-coder", list(found)) is None


def test_ollama_default_root_is_home(tmp_path):
    ollama_model(tmp_path / ".ollama" / "models", "tiny:1b", fake_gguf())
    assert [f.name for f in stores.discover(stores=["ollama"], env={}, home=tmp_path)] == ["tiny:1b"]


def test_ollama_missing_and_truncated_blobs_listed_failed(tmp_path):
    root = tmp_path / "ollama"
    ollama_model(root, "gone:1b", fake_gguf("gone"), write_blob=False)
    data = fake_gguf("truncated")
    ollama_model(root, "cut:1b", data, size=len(data) + 1000)
    ollama_model(root, "fine:1b", fake_gguf("fine"))
    (root / "manifests" / "registry.ollama.ai" / "library" / "junk").mkdir(parents=True)
    (root / "manifests" / "registry.ollama.ai" / "library" / "junk" / "latest").write_text("{not json")
    found = by_name(stores.discover(stores=["ollama"], env={"OLLAMA_MODELS": str(root)}, home=tmp_path))
    assert "missing" in found["gone:1b"].error and "sha256-" in found["gone:1b"].error
    assert f"is {len(data)} bytes, the manifest says {len(data) + 1000}" in found["cut:1b"].error
    assert "not an Ollama manifest" in found["junk:latest"].error
    assert found["fine:1b"].error is None


def test_lmstudio_hf_and_llama_cpp_stores(tmp_path):
    lms = tmp_path / ".lmstudio" / "models" / "lmstudio-community" / "Qwen2.5-0.5B-GGUF"
    lms.mkdir(parents=True)
    (lms / "Qwen2.5-0.5B-Q4_K_M.gguf").write_bytes(fake_gguf())
    several = tmp_path / ".lmstudio" / "models" / "bartowski" / "SmolLM2-GGUF"
    several.mkdir(parents=True)
    for q in ("Q4_K_M", "Q8_0"):
        (several / f"SmolLM2-{q}.gguf").write_bytes(fake_gguf(q))
    hub = tmp_path / ".cache" / "huggingface" / "hub" / "models--ggml-org--gemma-3-GGUF"
    blob = hub / "blobs" / "abc"
    blob.parent.mkdir(parents=True)
    blob.write_bytes(fake_gguf("gemma"))
    snap = hub / "snapshots" / "rev1"
    snap.mkdir(parents=True)
    (hub / "refs").mkdir()
    (hub / "refs" / "main").write_text("rev1")
    os.symlink(blob, snap / "gemma-3-Q4_K_M.gguf")
    cache = tmp_path / "llamacache"
    cache.mkdir()
    (cache / "ggml-org_gemma-3-GGUF_gemma-3-Q4_K_M.gguf").write_bytes(fake_gguf())
    found = by_name(stores.discover(stores=stores.parse_stores("lmstudio,hf,llama.cpp"),
                                    env={"LLAMA_CACHE": str(cache)}, home=tmp_path))
    assert found["lmstudio-community/Qwen2.5-0.5B-GGUF"].store == "lmstudio"
    assert {"bartowski/SmolLM2-GGUF/SmolLM2-Q4_K_M", "bartowski/SmolLM2-GGUF/SmolLM2-Q8_0"} <= set(found)
    assert found["ggml-org/gemma-3-GGUF"].path == snap / "gemma-3-Q4_K_M.gguf"
    assert found["ggml-org/gemma-3-GGUF"].error is None
    assert found["ggml-org_gemma-3-GGUF_gemma-3-Q4_K_M"].store == "llama.cpp"


def test_first_of_two_same_names_kept(tmp_path):
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "tiny:1b.gguf").write_bytes(fake_gguf("dir"))
    ollama_model(tmp_path / "o", "tiny:1b", fake_gguf("ollama"))
    found = stores.discover(tmp_path / "dir", ["ollama"], env={"OLLAMA_MODELS": str(tmp_path / "o")}, home=tmp_path)
    assert [(f.name, f.store) for f in found] == [("tiny:1b", "models-dir")]


@pytest.mark.parametrize("name", ["/etc/passwd", "../secret", "a/../../b", "~/models/x", "./x", "x.gguf",
                                  "C:\\models\\x", "models\\x", "a//b", "a\x00b"])
def test_path_like_names(name):
    assert stores.looks_like_path(name)


@pytest.mark.parametrize("name", ["qwen2.5-coder:1.5b", "someone/mymodel:q4", "ggml-org/gemma-3-GGUF:Q4_K_M",
                                  "llama-3.2-1b-Q4_K_M", "hf.co/bartowski/Qwen-GGUF:Q4_K_M"])
def test_model_names_are_not_paths(name):
    assert not stores.looks_like_path(name)


def test_parse_stores():
    assert stores.parse_stores("all") == stores.STORES
    assert stores.parse_stores("ollama, hf,ollama") == ("ollama", "hf")
    with pytest.raises(ValueError, match="unknown store.*nope.*known: ollama"):
        stores.parse_stores("ollama,nope")


def test_packaged_store_lists_pulled_models(tmp_path, monkeypatch):
    from specserve import models

    spec = next(s for s in models.MODELS if s.name == "gemma")
    monkeypatch.setenv("SPECSERVE_HOME", str(tmp_path))
    assert stores.discover(stores=["packaged"], env={}, home=tmp_path) == []
    Path(tmp_path / spec.filename).write_bytes(fake_gguf())
    monkeypatch.setattr(models, "_looks_present", lambda s, p: p.is_file())
    assert [(f.name, f.store) for f in stores.discover(stores=["packaged"], env={}, home=tmp_path)] == \
        [("gemma", "packaged")]


def test_llama_cpp_cache_named_by_its_manifests(tmp_path):
    import json

    cache = tmp_path / "llama.cpp"
    cache.mkdir()
    (cache / "manifest=ggml-org=gemma-3-4b-it-GGUF=Q4_K_M.json").write_text(
        json.dumps({"ggufFile": {"rfilename": "gemma-3-4b-it-Q4_K_M.gguf"}}))
    (cache / "ggml-org_gemma-3-4b-it-GGUF_gemma-3-4b-it-Q4_K_M.gguf").write_bytes(fake_gguf())
    (cache / "manifest=ggml-org=gone-GGUF=Q8_0.json").write_text(json.dumps({"ggufFile": {"rfilename": "g.gguf"}}))
    (cache / "loose.gguf").write_bytes(fake_gguf())
    found = by_name(stores.discover(stores=["llama.cpp"], env={"LLAMA_CACHE": str(cache)}, home=tmp_path))
    assert sorted(found) == ["ggml-org/gemma-3-4b-it-GGUF:Q4_K_M", "ggml-org/gone-GGUF:Q8_0", "loose"]
    assert found["ggml-org/gemma-3-4b-it-GGUF:Q4_K_M"].error is None
    assert "is not in the cache" in found["ggml-org/gone-GGUF:Q8_0"].error
