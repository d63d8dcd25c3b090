"""Cross-request drafting through the real server: a retried request drafts from the first one's
answer; `speculative.cross_request: false` and `--no-cross-request` opt out."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from server_fixtures import ServerProcess, post, serve_args, tiny_models_dir  # noqa: E402,F401

pytestmark = pytest.mark.server

PROMPT = "the dog ran in the park and the cat sat on the mat"


def start(models: Path, log: Path, *extra: str) -> ServerProcess:
    return ServerProcess(serve_args(models, "-c", "1024", "--parallel", "1", "--spec", "suffix", *extra), log)


def speculative(srv: ServerProcess, **spec) -> dict:
    body = {"prompt": PROMPT, "max_tokens": 40, "ignore_eos": True, "speculative": spec}
    return post(srv, "/v1/completions", body)["usage"]["speculative"]


def store_gauges(srv: ServerProcess) -> dict[str, float]:
    with srv.client() as c:
        text = c.get("/metrics").text
    return {line.split()[0].removeprefix("specserve:cross_request_store_"): float(line.split()[1])
            for line in text.splitlines() if line.startswith("specserve:cross_request_store_")}


def test_a_retry_drafts_from_the_first_answer_unless_opted_out(tiny_models_dir, tmp_path):
    srv = start(tiny_models_dir, tmp_path / "serve.log", "--cross-request-mib", "2")
    try:
        alone = speculative(srv, cross_request=False)  # drafts only from itself, stores nothing
        assert store_gauges(srv) == {"bytes": 0, "max_bytes": 2 << 20, "tokens": 0, "documents": 0}
        first = speculative(srv)
        assert alone["suffix_max"] == 64  # the suffix drafter's own cap, no draft_max given
        held = store_gauges(srv)
        assert held["documents"] == 1 and held["tokens"] > 40 and 0 < held["bytes"] <= held["max_bytes"]
        assert (first["drafted"], first["passes"]) == (alone["drafted"], alone["passes"])
        retry = speculative(srv)
        assert retry["mode"] == "suffix" and retry["passes"] <= 3 < first["passes"]
        assert speculative(srv, cross_request=False)["passes"] == alone["passes"]
        assert speculative(srv, cross_request_scope="other")["passes"] == alone["passes"]
        with srv.client() as c:
            r = c.post("/v1/completions", json={"prompt": PROMPT, "speculative": {"cross_request": "no"}})
            assert r.status_code == 400 and "speculative.cross_request" in r.text
    finally:
        assert srv.stop() == 0
    assert "Traceback" not in srv.log()


def test_no_cross_request_keeps_no_store(tiny_models_dir, tmp_path):
    srv = start(tiny_models_dir, tmp_path / "serve.log", "--no-cross-request")
    try:
        first, retry = speculative(srv), speculative(srv, cross_request=True)
        assert (retry["drafted"], retry["passes"]) == (first["drafted"], first["passes"])
        assert store_gauges(srv) == {}  # no store, no gauges
    finally:
        assert srv.stop() == 0
