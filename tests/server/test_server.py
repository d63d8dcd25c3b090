"""Contract tests against the real `specserve serve` on a free port, with tiny models.

Clients are the official `openai` package and plain httpx; the server is a
subprocess, so what is tested is what a user runs.
"""
from __future__ import annotations

import json
import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from server_fixtures import API_KEY, ServerProcess, metrics, serve_args, tiny_models_dir  # noqa: E402,F401

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.server

N_CTX = 4096
PROMPTS = ["the cat sat on the mat", "Once upon a time", "the dog ran in the park and", "hello world",
           "with that it was", "1 2 3 4 5"]


@pytest.fixture(scope="module")
def server(tiny_models_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("server_log") / "serve.log"
    srv = ServerProcess(serve_args(tiny_models_dir, "-c", str(N_CTX), "--alias", "tiny", "--parallel", "2",
                                   "--queue", "16", "--profile", "code=spec=draft,draft_max=6",
                                   "--profile", "plain=spec=none"), log, api_key=API_KEY)
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in srv.log() and "internal error" not in srv.log()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def http(server):
    with server.client() as c:
        yield c


def test_start_up_names_the_devices_llama_cpp_sees(server):
    """Before the models load, one line: llama.cpp's devices, and whether layers can leave the CPU."""
    lines = server.log().splitlines()
    line = next(row for row in lines if row.startswith("devices: "))
    assert "CPU (" in line
    assert lines.index(line) < min(i for i, row in enumerate(lines) if row.startswith("memory: "))


# --- the API ------------------------------------------------------------------------------------

def test_health_needs_no_key_and_everything_else_does(server):
    h = httpx.get(server.url + "/health")
    assert h.status_code == 200 and h.json()["status"] == "ok" and h.json()["rss_bytes"] > 0
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "x"}, headers=headers)
        assert r.status_code == 401, headers
        assert r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(server.url + "/metrics").status_code == 401


def test_models_lists_the_served_model_and_profiles(client):
    names = [m.id for m in client.models.list().data]
    assert names == ["tiny", "code", "plain"]


def test_completions_with_the_openai_client(client):
    r = client.completions.create(model="tiny", prompt="the cat sat", max_tokens=12, temperature=0)
    assert r.object == "text_completion" and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 12 and r.usage.prompt_tokens > 0
    spec = r.usage.speculative
    assert spec["mode"] == "auto" and spec["drafted"] >= spec["accepted"] >= 0 and spec["tokens_per_s"] > 0
    streamed = client.completions.create(model="tiny", prompt="the cat sat", max_tokens=12, temperature=0,
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == r.choices[0].text


def test_chat_with_the_openai_client(client):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=10, temperature=0)
    assert r.choices[0].message.role == "assistant" and r.usage.completion_tokens <= 10
    chunks = list(client.chat.completions.create(model="tiny", messages=msgs, max_tokens=10, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == r.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == r.usage.completion_tokens


def test_stream_ends_with_done(http):
    with http.stream("POST", "/v1/chat/completions", json={
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": True}) as r:
        lines = [ln for ln in r.iter_lines() if ln]
    assert r.headers["content-type"].startswith("text/event-stream")
    assert lines[-1] == "data: [DONE]" and all(ln.startswith("data: ") for ln in lines)


def test_profiles_and_the_speculative_extension(client):
    code = client.completions.create(model="code", prompt="the dog ran", max_tokens=16)
    assert code.usage.speculative["mode"] == "draft" and code.usage.speculative["draft_max"] == 6
    assert set(code.usage.speculative["drafter_steps"]) <= {"draft", "none"}
    plain = client.completions.create(model="plain", prompt="the dog ran", max_tokens=16)
    assert plain.usage.speculative["drafted"] == 0 and plain.choices[0].text == code.choices[0].text
    ngram = client.completions.create(model="code", prompt="the dog ran", max_tokens=16,
                                      extra_body={"speculative": {"mode": "ngram", "draft_max": 3}})
    assert ngram.usage.speculative["mode"] == "ngram" and ngram.choices[0].text == code.choices[0].text
    # any other name is the served model with its own profile (clients send their own defaults)
    other = client.completions.create(model="gpt-4o-mini", prompt="the dog ran", max_tokens=16,
                                      extra_body={"speculative": {"mode": "none"}})
    assert other.usage.speculative["mode"] == "none" and other.choices[0].text == code.choices[0].text


def test_llama_server_completion(http):
    # auto may have learnt by now that speculation does not pay on tiny models: ask for the draft model
    r = http.post("/completion", json={"prompt": "the cat sat on", "n_predict": 20, "temperature": 0,
                                       "speculative": {"mode": "draft", "draft_max": 4}})
    body = r.json()
    assert r.status_code == 200 and body["stop"] is True and body["tokens_predicted"] == 20
    t = body["timings"]
    assert t["predicted_n"] == 20 and t["draft_n"] >= t["draft_n_accepted"] >= 0 and t["draft_n"] > 0
    assert {"prompt_n", "prompt_ms", "predicted_ms", "predicted_per_second"} <= set(t)
    assert body["tokens_evaluated"] > 0
    flat = http.post("/completion", json={"prompt": "the cat sat on", "n_predict": 20, "speculative.n_max": 4})
    assert flat.status_code == 200 and flat.json()["content"] == body["content"]  # llama-server's flat keys
    with http.stream("POST", "/completion", json={"prompt": "the cat sat on", "n_predict": 20, "stream": True}) as s:
        events = [json.loads(ln[6:]) for ln in s.iter_lines() if ln.startswith("data: ")]
    assert events[-1]["stop"] is True and "timings" in events[-1]
    assert "".join(e["content"] for e in events) == body["content"]


# --- bad input: the right status, OpenAI's shape, never a 500 ----------------------------------------

C, CH = "/v1/completions", "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]
BAD = [  # (id, path, body (dict -> JSON, bytes -> raw), status)
    ("malformed-json", C, b'{"prompt": ', 400),
    ("not-an-object", C, b"[1, 2]", 400),
    ("invalid-utf8", C, b'{"prompt": "\xff\xfe"}', 400),
    ("lone-surrogate", C, b'{"prompt": "\\ud800"}', 400),
    ("deep-nesting", C, b"[" * 200_000, 400),
    ("nan-temperature", C, b'{"prompt": "x", "temperature": NaN}', 400),
    ("prompt-wrong-type", C, {"prompt": 5}, 400),
    ("prompt-missing", C, {"max_tokens": 5}, 400),
    ("prompt-empty", C, {"prompt": ""}, 400),
    ("prompt-empty-ids", C, {"prompt": []}, 400),
    ("prompt-bad-token-id", C, {"prompt": [1, 10**9]}, 400),
    ("max-tokens-string", C, {"prompt": "x", "max_tokens": "10"}, 400),
    ("max-tokens-zero", C, {"prompt": "x", "max_tokens": 0}, 400),
    ("max-tokens-negative", C, {"prompt": "x", "max_tokens": -3}, 400),
    ("max-tokens-absurd", C, {"prompt": "x", "max_tokens": 10**12}, 400),
    ("max-tokens-float", C, {"prompt": "x", "max_tokens": 1e400}, 400),
    ("temperature-negative", C, {"prompt": "x", "temperature": -0.5}, 400),
    ("temperature-string", C, {"prompt": "x", "temperature": "hot"}, 400),
    ("top-p-zero", C, {"prompt": "x", "top_p": 0}, 400),
    ("top-p-above-one", C, {"prompt": "x", "top_p": 1.5}, 400),
    ("top-k-negative", C, {"prompt": "x", "top_k": -1}, 400),
    ("seed-negative", C, {"prompt": "x", "seed": -1}, 400),
    ("stream-not-bool", C, {"prompt": "x", "stream": "yes"}, 400),
    ("stop-wrong-type", C, {"prompt": "x", "stop": 3}, 400),
    ("n-past-the-slots", C, {"prompt": "x", "n": 64}, 400),
    ("spec-not-object", C, {"prompt": "x", "speculative": "fast"}, 400),
    ("spec-unknown-key", C, {"prompt": "x", "speculative": {"turbo": 1}}, 400),
    ("spec-bad-mode", C, {"prompt": "x", "speculative": {"mode": "warp"}}, 400),
    ("spec-draft-max-huge", C, {"prompt": "x", "speculative": {"draft_max": 1000}}, 400),
    ("spec-draft-max-string", C, {"prompt": "x", "speculative": {"draft_max": "8"}}, 400),
    ("spec-p-min-one", C, {"prompt": "x", "speculative": {"draft_p_min": 1.0}}, 400),
    ("model-not-string", C, {"model": 3, "prompt": "x"}, 400),
    ("messages-missing", CH, {"model": "tiny"}, 400),
    ("messages-string", CH, {"messages": "hi"}, 400),
    ("messages-empty", CH, {"messages": []}, 400),
    ("message-no-role", CH, {"messages": [{"content": "hi"}]}, 400),
    ("message-content-number", CH, {"messages": [{"role": "user", "content": 5}]}, 400),
    ("chat-top-p", CH, {"messages": MSG, "top_p": -1}, 400),
    ("llama-n-predict-zero", "/completion", {"prompt": "x", "n_predict": 0}, 400),
    ("llama-both-spec-forms", "/completion", {"prompt": "x", "speculative.n_max": 2, "speculative": {}}, 400),
    ("llama-spec-n-max-string", "/completion", {"prompt": "x", "speculative.n_max": "2"}, 400),
    ("unknown-path", "/v1/engines", {}, 404),
]


@pytest.mark.parametrize("path,body,status", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_gets_its_status(http, path, body, status):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = http.post(path, content=content, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]


def test_prompt_longer_than_the_context_names_both_numbers(http):
    r = http.post(C, json={"prompt": "x" * (N_CTX + 100)})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and str(N_CTX) in err["message"]
    assert str(N_CTX + 100) in err["message"]


@pytest.mark.parametrize("chunked", [False, True])
def test_oversized_body_is_413(http, chunked):
    big = b'{"prompt": "' + b"x" * (5 << 20) + b'"}'
    content = (big[i:i + (1 << 20)] for i in range(0, len(big), 1 << 20)) if chunked else big
    r = http.post(C, content=content, headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"


def test_wrong_method_is_openai_shaped(http):
    r = http.get(C)
    assert r.status_code == 405 and "error" in r.json()


def test_no_bad_input_reached_the_catch_all(http):
    """Runs after the bad-input tests (file order): none of them was a 500."""
    m = metrics(http)
    assert m.get("specserve:request_errors_total{status=400}", 0) >= len([b for b in BAD if b[3] == 400])
    assert "specserve:request_errors_total{status=500}" not in m


# --- metrics ------------------------------------------------------------------------------------

def test_metrics_parse_and_move(http):
    before = metrics(http)
    r = http.post(C, json={"model": "code", "prompt": "the cat sat on the mat", "max_tokens": 24}).json()
    after = metrics(http)

    def delta(key: str) -> float:
        return after.get(key, 0) - before.get(key, 0)

    spec = r["usage"]["speculative"]
    assert delta("specserve:requests_total{endpoint=completions,finish_reason=length}") == 1
    assert delta("specserve:tokens_predicted_total") == 24
    assert delta("specserve:prompt_tokens_total") == r["usage"]["prompt_tokens"]
    assert delta("specserve:spec_decode_num_draft_tokens_total") == spec["drafted"] > 0
    assert delta("specserve:spec_decode_num_accepted_tokens_total") == spec["accepted"]
    per_pos = [k for k in after if k.startswith("specserve:spec_decode_num_accepted_tokens_per_pos_total")]
    assert per_pos and sum(delta(k) for k in per_pos) == spec["accepted"]
    assert delta("specserve:n_decode_total") == spec["passes"]
    assert delta("specserve:request_latency_seconds_count{endpoint=completions}") == 1
    assert delta("specserve:request_tokens_per_second_count") == 1
    assert after["specserve:requests_deferred"] == 0 and after["specserve:requests_processing"] == 0


# --- concurrency --------------------------------------------------------------------------------

def _complete(client, prompt: str, mode: str, stream: bool, max_tokens: int = 24) -> str:
    kw = dict(model="tiny", prompt=prompt, max_tokens=max_tokens, temperature=0,
              extra_body={"speculative": {"mode": mode}})
    if stream:
        return "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw) if c.choices)
    return client.completions.create(**kw).choices[0].text


def test_concurrent_requests_match_requests_served_alone(server, client):
    """8 clients x 3 greedy requests at once: each answer is the one the request gets alone."""
    alone = {p: _complete(client, p, "none", False) for p in PROMPTS}
    rng = random.Random(0)
    plans = [[(rng.choice(PROMPTS), rng.choice(["auto", "draft", "ngram", "none"]), rng.random() < 0.5)
              for _ in range(3)] for _ in range(8)]

    def run_client(plan):
        c = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)
        return [(p, _complete(c, p, mode, stream)) for p, mode, stream in plan]

    t0 = time.perf_counter()
    with ThreadPoolExecutor(8) as ex:
        results = [r for rs in ex.map(run_client, plans) for r in rs]
    assert len(results) == 24
    for prompt, text in results:
        assert text == alone[prompt], prompt
    assert time.perf_counter() - t0 < 60


def test_streams_interleave_step_by_step(server, client, http):
    """A short request finishes while a long stream is still going: steps interleave."""
    first = threading.Event()
    done = threading.Event()

    def long_stream():
        with server.client() as c, c.stream("POST", C, json={
                "prompt": "the cat", "max_tokens": 1500, "ignore_eos": True, "stream": True,
                "speculative": {"mode": "none"}}) as r:
            for line in r.iter_lines():
                first.set()
                if line == "data: [DONE]":
                    break
        done.set()

    t = threading.Thread(target=long_stream)
    t.start()
    assert first.wait(30)
    assert _complete(client, "hello world", "auto", False, max_tokens=8)
    assert not done.is_set(), "the short request waited for the long one"
    t.join(120)
    assert done.is_set()


def test_disconnect_mid_stream_frees_the_slot(server, http):
    before = metrics(http)
    with server.client() as c, c.stream("POST", C, json={
            "prompt": "the dog", "max_tokens": 4000, "ignore_eos": True, "stream": True,
            "speculative": {"mode": "none"}}) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                break  # leaving the block closes the connection mid-stream
    t0 = time.perf_counter()
    while http.get("/health").json()["slots_processing"] and time.perf_counter() - t0 < 10:
        time.sleep(0.02)
    health = http.get("/health").json()
    assert health["slots_processing"] == 0 and health["requests_active"] == 0
    after = metrics(http)
    key = "specserve:requests_total{endpoint=completions,finish_reason=cancelled}"
    assert after.get(key, 0) - before.get(key, 0) == 1
    generated = after["specserve:tokens_predicted_total"] - before["specserve:tokens_predicted_total"]
    assert generated < 2000, "generation went on after the client left"
    t1 = time.perf_counter()
    assert http.post(C, json={"prompt": "the dog", "max_tokens": 8}).status_code == 200
    assert time.perf_counter() - t1 < 10
    assert "cancelled" in server.log()
