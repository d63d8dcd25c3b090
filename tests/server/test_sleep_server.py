"""--sleep-idle-seconds on a real `specserve serve`: idle, it frees the models and slots' caches (resident
memory drops) and says so (/props and /health `is_sleeping`, the log); the read-only endpoints answer
without waking it; a request that needs the model wakes it and gets the same greedy text as before;
requests arriving during the wake all wait and succeed; a wake that cannot load the model is a 503."""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from server_fixtures import ServerProcess, post, serve_args, tiny_models_dir  # noqa: E402,F401

pytestmark = pytest.mark.server

KEY = "k-sleep"
IDLE_S = 1
N_CTX = 32768  # each slot's: the two models' caches for 2 slots take 32 MiB, which sleeping gives back
PROMPT = {"prompt": "The quick brown fox", "max_tokens": 12, "temperature": 0}
CHAT = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 10}


def start(models: Path, log: Path) -> ServerProcess:
    return ServerProcess(serve_args(models, "-c", str(N_CTX), "-np", "2", "--sleep-idle-seconds", str(IDLE_S),
                                    "--chat-template", "hermes"), log, api_key=KEY)


@pytest.fixture(scope="module")
def server(tiny_models_dir, tmp_path_factory):
    srv = start(tiny_models_dir, tmp_path_factory.mktemp("sleep") / "serve.log")
    yield srv
    assert srv.stop() == 0


@pytest.fixture()
def http(server):
    with server.client() as c:
        yield c


def sleeping(c: httpx.Client) -> bool:
    return c.get("/props").json()["is_sleeping"]


def wait_asleep(c: httpx.Client, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not sleeping(c):
        assert time.monotonic() < deadline, "the server did not go to sleep"
        time.sleep(0.1)


def completion(c: httpx.Client) -> str:
    return post(c, "/v1/completions", PROMPT)["choices"][0]["text"]


def test_idle_it_frees_the_models_and_the_read_only_endpoints_do_not_wake_it(server, http):
    for _ in range(5):  # awake, caches in use (on a machine slow enough to sleep in between: again)
        assert completion(http)
        health = http.get("/health").json()
        if not health["is_sleeping"]:
            break
    awake_rss = health["rss_bytes"]
    wait_asleep(http)
    health = http.get("/health").json()
    asleep_rss = health["rss_bytes"]
    assert health["is_sleeping"] and health["status"] == "ok"
    assert awake_rss - asleep_rss > 16 << 20, (awake_rss, asleep_rss)  # at least half the 32 MiB of caches
    assert "asleep after 1 s without requests: models and slots' caches freed" in server.log()
    for path in ("/health", "/v1/health", "/props", "/metrics", "/slots", "/v1/models", "/models"):
        assert http.get(path).status_code == 200, path
    assert http.post("/props", json={}).status_code == 501
    assert http.get("/nowhere").status_code == 404
    # refused before it reaches the model: a request without the key wakes nothing
    assert httpx.post(server.url + "/v1/completions", json=PROMPT).status_code == 401
    props = http.get("/props").json()
    assert props["is_sleeping"] and props["bos_token"] and props["model_path"] == "tiny.gguf"
    assert http.get("/v1/models").json()["data"][0]["id"] == "tiny"
    assert sleeping(http)


def test_a_request_wakes_it_and_gets_the_same_greedy_text_as_before(server, http):
    before = completion(http)
    template = http.post("/apply-template", json=CHAT).json()["prompt"]
    chat = http.post("/v1/chat/completions", json=CHAT).json()["choices"][0]["message"]["content"]
    wait_asleep(http)
    assert completion(http) == before
    assert not sleeping(http)
    log = server.log()
    assert "waking: a request needs the model" in log and "awake: models and slots loaded again in" in log
    # the --chat-template given at start still renders chats after the reload
    for endpoint in ("/apply-template", "/tokenize", "/v1/chat/completions"):
        wait_asleep(http)
        body = {"content": "hello"} if endpoint == "/tokenize" else CHAT
        r = http.post(endpoint, json=body)
        assert r.status_code == 200 and not sleeping(http), (endpoint, r.text)
        if endpoint == "/apply-template":
            assert r.json()["prompt"] == template and "<|im_start|>user\nhello there" in template
        if endpoint == "/v1/chat/completions":
            assert r.json()["choices"][0]["message"]["content"] == chat


def _one(server: ServerProcess, i: int) -> tuple[str, str]:
    with server.client() as c:
        if i % 3 == 0:  # a stream: the wake comes before its first byte
            with c.stream("POST", "/v1/completions", json={**PROMPT, "stream": True}) as r:
                assert r.status_code == 200
                lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
            return "completion", "".join(json.loads(e)["choices"][0]["text"] for e in lines[:-1])
        if i % 3 == 1:
            return "completion", completion(c)
        r = c.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 200, r.text
        return "chat", r.json()["choices"][0]["message"]["content"]


def test_requests_arriving_during_the_wake_all_wait_and_succeed(server, http):
    expected = {"completion": completion(http),
                "chat": http.post("/v1/chat/completions", json=CHAT).json()["choices"][0]["message"]["content"]}
    wait_asleep(http)
    wakes = server.log().count("awake: models and slots loaded again")
    with ThreadPoolExecutor(8) as pool:  # more than the 2 slots: some queue behind the others
        answers = list(pool.map(lambda i: _one(server, i), range(8)))
    assert all(text == expected[kind] for kind, text in answers), answers
    log = server.log()
    assert log.count("awake: models and slots loaded again") == wakes + 1  # one wake served all 8
    assert "llama.cpp passes run on 2 threads" not in log  # each wake's engine thread replaces the last one's


def test_a_model_that_cannot_be_loaded_again_is_a_503_and_the_next_request_tries_again(tiny_models_dir, tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    for name in ("tiny.gguf", "tiny_draft.gguf"):
        shutil.copy(tiny_models_dir / name, models / name)
    srv = start(models, tmp_path / "serve.log")
    try:
        with srv.client() as c:
            wait_asleep(c)
            target = models / "tiny.gguf"
            os.utime(target, ns=(time.time_ns(), time.time_ns() + 10**9))  # changed since it was loaded
            r = c.post("/v1/completions", json=PROMPT)
            assert r.status_code == 503 and r.json()["error"]["code"] == "wake_failed", r.text
            assert "changed on disk" in r.json()["error"]["message"] and sleeping(c)
            assert c.get("/health").status_code == 200
            r = c.post("/v1/messages", json={"model": "tiny", "max_tokens": 4, "messages": CHAT["messages"]})
            assert r.status_code == 503 and r.json()["type"] == "error"  # in the API's own error shape
    finally:
        assert srv.stop() == 0
