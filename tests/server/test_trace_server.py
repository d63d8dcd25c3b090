"""`"speculative": {"trace": true}` against the real server: off, responses are byte for byte what
they were; on, every chunk says who produced each token of its text.

A profile with a fixed drafter (spec=draft) and seeded sampling make two requests take the same
steps, so their answers can be compared byte for byte once the per-request id, time and
timings are blanked; cache_prompt=false keeps the second from finding the first's prompt cached.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from server_fixtures import ServerProcess, post_bytes, serve_args, tiny_models_dir  # noqa: E402,F401

pytestmark = pytest.mark.server

MSG = [{"role": "user", "content": "the cat sat on the mat and the cat"}]
BASE = {"model": "fixed", "seed": 3, "temperature": 0.8, "max_tokens": 40, "cache_prompt": False}
# what usage.speculative holds without the trace, in its order
SPEC_USAGE_KEYS = ["mode", "verify", "draft_max", "suffix_max", "drafter_steps", "passes", "drafted", "accepted",
                   "acceptance", "mean_accepted_len", "tokens_per_s", "drafted_by_position", "accepted_by_position",
                   "prompt_s", "decode_s", "queue_s"]
_VARIES = re.compile(r'("id": ?"[^"]*"|"created": ?\d+|"(?:tokens_per_s|prompt_s|decode_s|queue_s|[a-z_]+_ms|'
                     r'[a-z_]+_per_second|[a-z_]+_per_token_ms)": ?[0-9.e+-]+)')


@pytest.fixture(scope="module")
def server(tiny_models_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("trace_log") / "serve.log"
    srv = ServerProcess(serve_args(tiny_models_dir, "--alias", "tiny", "--profile", "fixed=spec=draft,draft_max=6"),
                        log)
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in srv.log()


def blank(raw: bytes) -> str:
    """The response with what differs between any two requests (id, time, timings) blanked."""
    return _VARIES.sub(lambda m: m.group(0).split(":")[0] + ":0", raw.decode())


def events(raw: bytes) -> list[dict]:
    lines = [line[6:] for line in raw.decode().split("\n") if line.startswith("data: ")]
    return [json.loads(x) for x in lines if x != "[DONE]"]


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": MSG, "stream": True}),
    ("/v1/chat/completions", {"messages": MSG}),
    ("/v1/completions", {"prompt": "the cat sat on the", "stream": True}),
    ("/completion", {"prompt": "the cat sat on the"}),
], ids=["chat-stream", "chat", "completions-stream", "llama"])
def test_trace_off_answers_byte_for_byte_as_without_the_field(server, path, body):
    without = post_bytes(server, path, {**BASE, **body})
    off = post_bytes(server, path, {**BASE, **body, "speculative": {"trace": False}})
    assert blank(off) == blank(without)
    assert b"speculative_trace" not in without and b"target_alone" not in without
    objs = events(without) if body.get("stream") else [json.loads(without)]
    spec = objs[-1]["usage"]["speculative"] if "usage" in objs[-1] else objs[-1]["speculative"]
    assert list(spec) == SPEC_USAGE_KEYS


def test_a_streamed_trace_tells_each_tokens_source_and_its_runs_make_the_text(server):
    body = {**BASE, "messages": MSG, "stream": True}
    plain = events(post_bytes(server, "/v1/chat/completions", body))
    traced = events(post_bytes(server, "/v1/chat/completions", {**body, "speculative": {"trace": True}}))
    def content(objs):
        return "".join(o["choices"][0]["delta"].get("content") or "" for o in objs if o["choices"])
    assert content(traced) == content(plain) != ""  # the trace changes no token
    seen = []
    for o in traced:
        choice = o["choices"][0]
        if choice["delta"].get("content"):
            trace = choice["speculative_trace"]
            assert "".join(e["text"] for e in trace) == choice["delta"]["content"]
            seen += [e["source"] for e in trace]
    assert set(seen) <= {"draft", "target"} and "draft" in seen and "target" in seen
    usage = traced[-1]["usage"]
    assert usage["speculative"]["accepted"] >= seen.count("draft") - 2  # runs are per token (a few split)
    alone = usage["speculative"]["target_alone_tokens_per_s"]
    assert alone is None or alone > 0


@pytest.mark.parametrize("path,body,text", [
    ("/v1/chat/completions", {"messages": MSG}, lambda o: o["choices"][0]["message"]["content"]),
    ("/v1/completions", {"prompt": "the cat sat on the"}, lambda o: o["choices"][0]["text"]),
    ("/completion", {"prompt": "the cat sat on the"}, lambda o: o["content"]),
], ids=["chat", "completions", "llama"])
def test_a_whole_answer_carries_the_trace_of_its_whole_text(server, path, body, text):
    out = json.loads(post_bytes(server, path, {**BASE, **body, "speculative": {"trace": True}}))
    trace = out["choices"][0]["speculative_trace"] if "choices" in out else out["speculative_trace"]
    assert "".join(e["text"] for e in trace) == text(out) != ""
    assert {e["source"] for e in trace} <= {"draft", "target"}


def test_streamed_llama_and_completions_chunks_carry_their_runs(server):
    for path, key in (("/v1/completions", "text"), ("/completion", "content")):
        objs = events(post_bytes(server, path, {**BASE, "prompt": "the cat sat on the", "stream": True,
                                          "speculative": {"trace": True}}))
        n = 0
        for o in objs:
            part = o["choices"][0] if "choices" in o else o
            if part.get(key):
                assert "".join(e["text"] for e in part["speculative_trace"]) == part[key]
                n += 1
        assert n


def test_trace_must_be_a_boolean(server):
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": MSG, "speculative": {"trace": "yes"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "speculative.trace"


def test_the_overhead_tool_pairs_trace_on_and_off(server, capsys):
    from specserve.measure.trace_overhead import main

    assert main(["--url", server.url, "--rounds", "1", "--prompts", "2", "--max-tokens", "8"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["pairs"] == 2 and all(r > 0 for r in out["median_on_over_off"].values())


def test_infill_refuses_the_trace(server):
    # /infill's line rules cut the text after generation: a trace would not match it
    r = httpx.post(server.url + "/infill", json={"input_prefix": "def f(", "input_suffix": ")\n",
                                                  "speculative": {"trace": True}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "speculative.trace"


def test_a_repeated_request_traces_its_copy_to_the_earlier_answer(server):
    """The same request again, with another request between: the suffix drafter copies the earlier
    answer, and each copied run says so (`from`: the same request, one continuation, the request it
    came from)."""
    prompt = " ".join(f"item{i} costs {i * 7 % 13} coins" for i in range(12))  # > 64 tokens, no repeats
    spec = {"mode": "suffix", "cross_request_scope": "trace-repeat"}
    body = {"prompt": prompt, "temperature": 0, "max_tokens": 24, "cache_prompt": False, "speculative": spec}
    first = json.loads(post_bytes(server, "/completion", body))
    post_bytes(server, "/completion", {**body, "prompt": "the dog ran past the cat and the dog"})
    again = json.loads(post_bytes(server, "/completion", {**body, "speculative": {**spec, "trace": True}}))
    assert again["content"] == first["content"] != ""
    copied = [e for e in again["speculative_trace"] if e["source"] == "suffix"]
    assert copied and all(e["from"]["same_request"] and e["from"]["continuations"] == 1 for e in copied)
    assert {e["from"]["requests_ago"] for e in copied} == {2}  # the other request came between


@pytest.mark.parametrize("seed,asked,used", [
    (3, None, "gumbel"),  # a seeded request keeps the seed's text: gumbel
    (None, None, "rejection"),  # llama-server's -1 (or none at all): nothing to keep, rejection keeps more
    (-1, None, "rejection"),
    (None, "gumbel", "gumbel"),  # asked for by name: as asked
    (3, "rejection", "rejection"),
], ids=["seeded", "unseeded", "seed-minus-one", "asked-gumbel", "asked-rejection"])
def test_the_default_verify_is_told_apart_by_the_seed_and_usage_names_the_one_used(server, seed, asked, used):
    body = {"model": "fixed", "prompt": "the cat sat on the", "temperature": 0.8, "n_predict": 12,
            "cache_prompt": False, **({"seed": seed} if seed is not None else {}),
            **({"speculative": {"verify": asked}} if asked else {})}
    out = json.loads(post_bytes(server, "/completion", body))
    assert out["speculative"]["verify"] == used and out["speculative"]["drafted"] > 0
    props = httpx.get(server.url + "/props").json()  # the server's default, as a request that sets nothing gets it
    assert props["default_generation_settings"]["params"]["speculative"]["verify"] == "auto"
