"""`-md auto` and `-md none` on the real server and CLI: the choice and its reason at start, in /props,
/v1/models, Ollama's /api/ps and /api/show (with the official `ollama` client), and a start without a draft
that says why."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from server_fixtures import ServerProcess  # noqa: E402
from tiny_models import write_tiny_model  # noqa: E402

pytestmark = pytest.mark.server

ollama = pytest.importorskip("ollama")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A target, a cheap draft of its vocabulary, a costlier one, and one of another vocabulary; and an
    empty model cache, so that no packaged model is a candidate."""
    d = tmp_path_factory.mktemp("auto_draft")
    write_tiny_model(d / "target.gguf", seed=1, n_layer=4, n_embd=128, n_ff=256)
    write_tiny_model(d / "small.gguf", seed=1, n_layer=1, n_embd=64, n_ff=128)
    write_tiny_model(d / "medium.gguf", seed=2, n_layer=2, n_embd=64, n_ff=128)
    write_tiny_model(d / "spm.gguf", seed=1, n_layer=1, n_embd=64, n_ff=128, tokenizer_model="llama")
    (d / "home").mkdir()
    return d


def env(folder) -> dict:
    return {"SPECSERVE_HOME": str(folder / "home")}


@pytest.fixture(scope="module")
def server(folder):
    srv = ServerProcess(["-m", str(folder / "target.gguf"), "-md", "auto", "-t", "1", "-c", "512"],
                        folder / "serve.log", env=env(folder))
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in srv.log()


def test_the_choice_and_its_reason_at_start(server):
    log = server.log()
    assert "draft: small: the cheapest of 2 pairable candidate(s)" in log
    assert "draft:     medium: a pass costs" in log
    assert "draft:   - spm: excluded, vocabulary mismatch: tokenizer model llama, the target's gpt2" in log


def test_props_show_the_choice_in_llama_servers_shape(server):
    p = httpx.get(server.url + "/props").json()
    assert p["model_path"] == "target.gguf" and p["draft_model_path"] == "small.gguf"  # unchanged fields
    c = p["draft_choice"]
    assert (c["mode"], c["chosen"], c["file"]) == ("auto", "small", "small.gguf")
    assert c["reason"].startswith("small: the cheapest of 2")
    assert [x["name"] for x in c["candidates"]] == ["small", "medium"]
    assert c["candidates"][0]["cost"] < c["candidates"][1]["cost"] < 0.5
    assert [x["name"] for x in c["excluded"]] == ["spm"]
    assert "path" not in c["candidates"][0] and str(server.log_path.parent) not in json.dumps(c)  # no host paths


def test_models_carry_it(server):
    entry = httpx.get(server.url + "/v1/models").json()["data"][0]["specserve"]
    assert entry["draft"] == "small.gguf" and entry["draft_choice"]["chosen"] == "small"


def test_ollama_ps_and_show_carry_it(server):
    client = ollama.Client(host=server.url, timeout=60)
    shown = client.show("target")
    assert shown.details.family == "llama"  # the client still reads the rest
    raw = httpx.post(server.url + "/api/show", json={"model": "target"}).json()
    assert raw["draft_choice"]["chosen"] == "small"
    assert client.ps().models[0].model == "target"
    assert httpx.get(server.url + "/api/ps").json()["models"][0]["draft_choice"]["chosen"] == "small"
    out = client.generate("target", "hello", options={"temperature": 0, "num_predict": 8})
    assert out.done and out.eval_count > 0


def test_no_pairable_candidate_starts_without_a_draft_and_says_why(folder, tmp_path):
    lone = tmp_path / "lone"
    lone.mkdir()
    target = write_tiny_model(lone / "target.gguf", seed=1)
    write_tiny_model(lone / "spm.gguf", seed=1, n_layer=1, tokenizer_model="llama")
    srv = ServerProcess(["-m", str(target), "-md", "auto", "-t", "1", "-c", "512"], tmp_path / "serve.log",
                        env=env(folder))
    try:
        p = httpx.get(srv.url + "/props").json()
        assert p["draft_model_path"] is None and p["draft_choice"]["chosen"] is None
        assert p["draft_choice"]["reason"].startswith("none: no candidate pairs with the target")
        assert "running without a draft model" in srv.log()
        r = httpx.post(srv.url + "/completion", json={"prompt": "hi", "n_predict": 4, "temperature": 0})
        assert r.status_code == 200 and r.json()["tokens_predicted"] == 4
    finally:
        assert srv.stop() == 0


def test_generate_md_none_and_auto(folder):
    def generate(md: str) -> dict:
        out = subprocess.run([sys.executable, "-m", "specserve", "generate", "-m", str(folder / "target.gguf"),
                              "-md", md, "-p", "hi", "-n", "4", "-t", "1", "-c", "256", "--json"],
                             capture_output=True, text=True, timeout=120, env={**os.environ, **env(folder)})
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    auto, none = generate("auto"), generate("none")
    assert auto["draft_choice"]["chosen"] == "small" and none["draft_choice"]["mode"] == "none"
    assert none["draft_choice"]["chosen"] is None and auto["tokens"] == none["tokens"]  # greedy: the target's text
