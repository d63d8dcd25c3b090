"""Logprobs through the server under speculation are the target alone's, on the reference pair (Qwen2.5-Coder
1.5B F16 + 0.5B draft): the same request with `speculative.mode` "draft" and "none" gives the same tokens
and the same logprobs and alternatives, greedy and seeded (--verify gumbel, the default), whole and
streamed. The tolerance is tests/test_logprobs.py's for F16 targets (TOL_F16: batched and one-token
passes round logits differently); where the text parts at a near-tie of the target's best two logprobs
(greedy), the logprobs are compared up to there."""
from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from lossless_checks import EPS_F16  # noqa: E402  (the gap under which greedy text may part)
from server_fixtures import ServerProcess, chat, streamed_logprobs  # noqa: E402

pytestmark = [pytest.mark.server, pytest.mark.real_models]

TOL_F16 = 0.05  # tests/test_logprobs.py
ASK = [{"role": "user", "content": "Write a Python function that returns the square of a number."}]


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    from specserve import models

    d = tmp_path_factory.mktemp("qwen_logprobs")
    srv = ServerProcess(["-m", models.ensure("qwen2.5-coder-1.5b-f16"), "-md", models.ensure("qwen2.5-coder-0.5b"),
                         "-c", "1024", "--parallel", "1"], d / "serve.log")
    try:
        with httpx.Client(base_url=srv.url, timeout=900) as client:  # the 1.5B F16 on 2 cores: minutes a request
            yield client
    finally:
        assert srv.stop() == 0


def _body(sampling: dict, mode: str) -> dict:
    return {"messages": ASK, "max_tokens": 32, "logprobs": True, "top_logprobs": 5, **sampling,
            "speculative": {"mode": mode, "draft_max": 6}}


def _whole(http, body: dict) -> tuple[list[dict], dict]:
    answer = chat(http, body)
    return answer["choices"][0]["logprobs"]["content"], answer["usage"]["speculative"]


def _same(alone: list[dict], other: list[dict], greedy: bool, label: str) -> int:
    ids_a, ids_b = [e["id"] for e in alone], [e["id"] for e in other]
    n = next((i for i, (a, b) in enumerate(zip(ids_a, ids_b)) if a != b), None)
    if n is None:
        assert len(ids_a) == len(ids_b), label
        n = len(ids_a)
    else:  # parted: only where greedy's best two were within the rounding (none seeded: gumbel is exact)
        top = alone[n]["top_logprobs"]
        assert greedy and top[0]["logprob"] - top[1]["logprob"] < EPS_F16, f"{label}: parted at token {n}"
    for i, (a, b) in enumerate(zip(alone[:n], other[:n])):
        assert abs(a["logprob"] - b["logprob"]) < TOL_F16, f"{label}: token {i}"
        assert len(a["top_logprobs"]) == len(b["top_logprobs"]) == 5, f"{label}: token {i}"
        for rank, (x, y) in enumerate(zip(a["top_logprobs"], b["top_logprobs"])):
            # two alternatives within the tolerance may trade places; the values at each rank agree
            assert abs(x["logprob"] - y["logprob"]) < TOL_F16, f"{label}: token {i} rank {rank}"
            assert x["id"] == y["id"] or abs(x["logprob"] - y["logprob"]) < TOL_F16
    return n


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.7, "seed": 1}], ids=["greedy", "seeded"])
def test_logprobs_with_speculation_are_the_target_alones_whole_andstreamed_logprobs(http, sampling):
    alone, usage = _whole(http, _body(sampling, "none"))
    assert usage["drafted"] == 0 and len(alone) == 32
    spec, usage = _whole(http, _body(sampling, "draft"))
    assert usage["accepted"] > 8  # the draft wrote much of it: rows from the verification pass
    greedy = not sampling.get("temperature")
    assert _same(alone, spec, greedy, "whole") > 8
    assert _same(alone, streamed_logprobs(http, _body(sampling, "draft")), greedy, "streamed") > 8
