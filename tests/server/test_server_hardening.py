"""What a hostile client found (issue 15): one test per defect, against the real server.

The number in a test's name is the issue's item. Most tests share one server: one slot,
a queue of two, a 2 s read timeout, a cap of 8 connections, its API key from the
environment, CORS for one origin. Drain tests start their own; the 500 test runs the
app in-process, where a bug can be planted.
"""
from __future__ import annotations

import json
import select
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from server_fixtures import ServerProcess, free_port, serve_args, tiny_models_dir  # noqa: E402,F401

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

pytestmark = pytest.mark.server

KEY = "key-from-the-environment"
WEB = "http://localhost:3000"  # the one origin the shared server allows
C, CH, L = "/v1/completions", "/v1/chat/completions", "/completion"
MSG = [{"role": "user", "content": "hi"}]
JSON = {"Content-Type": "application/json"}
LONG = {"prompt": "the cat", "max_tokens": 8000, "ignore_eos": True, "stream": True, "speculative": {"mode": "none"}}


@pytest.fixture(scope="module")
def server(tiny_models_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("hardening") / "serve.log"
    srv = ServerProcess(serve_args(tiny_models_dir, "-c", "8192", "--alias", "tiny", "--parallel", "1", "--queue", "2",
                                   "--read-timeout", "2", "--max-connections", "8", "--cors-origin", WEB),
                        log, env={"SPECSERVE_API_KEY": KEY})
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in srv.log()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, headers={"X-Api-Key": KEY}, timeout=60) as c:
        yield c


def _wait_for(predicate, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def _health(srv) -> dict:
    return httpx.get(srv.url + "/health").json()


def _requests_total(http) -> float:
    return sum(s.value for fam in text_string_to_metric_families(http.get("/metrics").text)
               for s in fam.samples if s.name == "specserve:requests_total")


def _raw(sock: socket.socket, head: bytes, body: bytes = b"") -> tuple[int, dict, bytes] | None:
    """Send one request on `sock` and read its answer (Content-Length bodies); None if the server closed."""
    sock.sendall(head + body)
    data = b""
    while b"\r\n\r\n" not in data:
        part = sock.recv(65536)
        if not part:
            return None
        data += part
    header, _, rest = data.partition(b"\r\n\r\n")
    lines = header.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    while len(rest) < int(headers.get("content-length", 0)):
        part = sock.recv(65536)
        if not part:
            return None
        rest += part
    return int(lines[0].split()[1]), headers, rest


def _post_head(path: str, port: int, n: int, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {n}\r\n{extra}\r\n").encode()


class LongStream:
    """A stream that holds the only slot until `stop()` (a thread reading it, then hanging up)."""

    def __init__(self, srv):
        self.started, self.stopping = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run, args=(srv,))
        self.thread.start()
        assert self.started.wait(30)

    def _run(self, srv) -> None:
        with httpx.Client(base_url=srv.url, headers={"X-Api-Key": KEY}, timeout=60) as c, \
                c.stream("POST", C, json=LONG) as r:
            for line in r.iter_lines():
                self.started.set()
                if self.stopping.is_set():
                    break

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(60)


# --- 1. huge temperatures: 400 naming the field, never a 500 ----------------------------------------

@pytest.mark.parametrize("raw", [b"1e308", b"Infinity", b"101"])
def test_1_a_huge_temperature_is_a_400_naming_the_field(http, raw):
    body = b'{"prompt": "the cat", "max_tokens": 4, "temperature": ' + raw + b'}'
    r = http.post(C, content=body, headers=JSON)  # speculation auto: it planned with round(temperature * 4)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "temperature"


# --- 2. a 500 leaves the keep-alive connection usable ------------------------------------------------

def test_2_after_a_500_the_connection_still_serves(tiny_models_dir, monkeypatch):
    import uvicorn

    from specserve.config import ModelConfig
    from specserve.engine import Engine
    from specserve.server import ServerSettings, create_app
    from specserve.server.core import jobs

    def planted_bug(model, req):
        raise RuntimeError("a planted bug")

    monkeypatch.setattr(jobs, "prompt_ids", planted_bug)
    engine = Engine.load(ModelConfig(str(tiny_models_dir / "tiny.gguf"), n_ctx=256, n_threads=1))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(engine, ServerSettings(model_name="tiny")), host="127.0.0.1",
                                           port=port, log_config=None, lifespan="on"))
    thread = threading.Thread(target=server.run)
    thread.start()
    try:
        assert _wait_for(lambda: server.started, 30)
        body = b'{"prompt": "hi", "max_tokens": 2}'
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            status, headers, content = _raw(s, _post_head(C, port, len(body)), body)
            assert status == 500 and json.loads(content)["error"]["code"] == "internal_error"
            second = _raw(s, f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            assert second is not None or headers.get("connection") == "close", "closed without Connection: close"
            assert second is not None and second[0] == 200
    finally:
        server.should_exit = True
        thread.join(30)
        engine.close()


# --- 3. a tiny temperature is greedy, not NaN garbage ---------------------------------------------------

def test_3_a_tiny_temperature_is_greedy(http):
    def text(temperature: float) -> str:
        r = http.post(C, json={"prompt": "the cat sat", "max_tokens": 16, "temperature": temperature,
                               "speculative": {"mode": "none"}})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    greedy = text(0)
    assert all(text(t) == greedy for t in (1e-40, 1e-300, 5e-6))


# --- 4. a client that gives up while queued is dropped ---------------------------------------------------

def test_4_clients_that_give_up_in_the_queue_are_dropped(server, http):
    long = LongStream(server)
    try:
        before = _requests_total(http)
        with pytest.raises(httpx.TimeoutException):  # a plain request...
            httpx.post(server.url + C, json={"prompt": "ghost one", "max_tokens": 4}, headers={"X-Api-Key": KEY},
                       timeout=0.5)
        with pytest.raises(httpx.TimeoutException), httpx.stream(  # ...and a stream, both waiting for the slot
                "POST", server.url + C, json={"prompt": "ghost two", "max_tokens": 4, "stream": True},
                headers={"X-Api-Key": KEY}, timeout=0.5) as r:
            r.read()
        assert _wait_for(lambda: _health(server)["queue_depth"] == 0, 5), _health(server)

        # The queue (2) has room again: two new requests wait for the slot instead of getting 503.
        answers = []
        waiting = [threading.Thread(target=lambda: answers.append(
            http.post(C, json={"prompt": "a real one", "max_tokens": 4}))) for _ in range(2)]
        for t in waiting:
            t.start()
        assert _wait_for(lambda: _health(server)["queue_depth"] == 2, 10), _health(server)
    finally:
        long.stop()
    for t in waiting:
        t.join(60)
    assert [r.status_code for r in answers] == [200, 200]
    assert _wait_for(lambda: _health(server)["requests_active"] == 0, 10)
    assert _requests_total(http) - before == 3, "a ghost ran its prompt"  # the long stream and the two


def test_4_streams_dropped_and_resent_at_once_get_no_503(server):
    """As many clients as places (1 slot + 2 queued), each dropping its stream after the first
    event and sending the next at once: the slot on its way back counts as free."""
    refused = []

    def client(i: int) -> None:
        with httpx.Client(base_url=server.url, headers={"X-Api-Key": KEY}, timeout=60) as c:
            for n in range(10):
                body = {"prompt": f"client {i} request {n}", "max_tokens": 500, "ignore_eos": True, "stream": True,
                        "speculative": {"mode": "none"}}
                with c.stream("POST", C, json=body) as r:
                    if r.status_code != 200:
                        refused.append(r.status_code)
                        continue
                    for line in r.iter_lines():
                        if line.startswith("data: "):
                            break

    threads = [threading.Thread(target=client, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert refused == []


# --- 5. client strings cannot forge log lines ---------------------------------------------------------

def test_5_client_strings_cannot_forge_log_lines(server, http):
    forged = "ERROR specserve.server: forged"
    # any model name is served (by the served model's profile, whose name is what the request line logs)
    assert http.post(C, json={"model": f"x\n{forged} by a model name", "prompt": "hi", "max_tokens": 1}).status_code == 200
    assert http.post(C, json={"prompt": "hi", "speculative": {f"k\r\n{forged} by a key": 1}}).status_code == 400
    assert http.post(C, json={"prompt": "hi", "speculative": {"mode": f"\u2028{forged} by a mode"}}).status_code == 400
    time.sleep(0.3)
    lines = server.log().splitlines()
    assert not [ln for ln in lines if ln.startswith(forged)]
    assert sum("forged by a" in ln for ln in lines) == 2  # logged, escaped, on the request's own line


# --- 7. fields we do not implement are refused, consistently ------------------------------------------

REFUSED = [
    (CH, {"functions": [{"name": "f"}]}, "functions"),
    (CH, {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is in this picture?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]}, "messages[0].content[1]"),
    (C, {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    (L, {"typical_p": 0.5}, "typical_p"),
    (L, {"dry_multiplier": 0.8}, "dry_multiplier"),
    (C, {"top_logprobs": 2}, "top_logprobs"),  # chat's field: completions takes logprobs, a number
]
NEUTRAL = [
    (CH, {"response_format": {"type": "text"}, "tool_choice": "auto", "tools": []}),
    (CH, {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}),
    (L, {"typical_p": 1.0, "n_probs": 0, "grammar": "", "mirostat": 0}),
]


def _base(path: str) -> dict:
    return {"messages": MSG, "max_tokens": 2} if path == CH else {"prompt": "hi", "max_tokens": 2}


@pytest.mark.parametrize("path,fields,param", REFUSED, ids=[f"{p}-{f}" for p, _, f in REFUSED])
def test_7_unimplemented_fields_are_refused(http, path, fields, param):
    r = http.post(path, json={**_base(path), **fields})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "unsupported_parameter" and err["param"] == param


@pytest.mark.parametrize("path,fields", NEUTRAL, ids=[p for p, _ in NEUTRAL])
def test_7_neutral_values_of_those_fields_pass(http, path, fields):
    assert http.post(path, json={**_base(path), **fields}).status_code == 200


# --- 8. slow and stalled clients; the connection cap -------------------------------------------------

def test_8_a_slowloris_connection_is_closed(server):
    """Headers dripped a byte at a time never complete: the connection is closed at the read timeout (2 s)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Drip: ")
        t0, closed = time.monotonic(), False
        while time.monotonic() - t0 < 8 and not closed:
            if select.select([s], [], [], 0.25)[0]:
                try:
                    closed = s.recv(1024) == b""
                except ConnectionResetError:    # closed while our drip was in flight: the kernel answers RST
                    closed = True
                break
            try:
                s.sendall(b"a")
            except OSError:
                closed = True
        assert closed, "the server kept a connection whose headers never ended"
        assert time.monotonic() - t0 < 6


def test_8_a_stalled_body_gets_408(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        t0 = time.monotonic()
        answer = _raw(s, _post_head(C, server.port, 100, f"X-Api-Key: {KEY}\r\n"), b'{"prompt": ')
        assert answer is not None and answer[0] == 408, answer
        assert json.loads(answer[2])["error"]["code"] == "request_timeout" and time.monotonic() - t0 < 6


def test_8_connections_beyond_the_cap_get_503(server):
    """Beyond the cap every request gets 503 but /health (issue 39: a prober must not see a dead server)."""
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(8)]
    try:
        r = httpx.get(server.url + "/v1/models", headers={"X-Api-Key": KEY})
        assert r.status_code == 503 and r.json()["error"]["code"] == "too_many_connections"
        assert httpx.get(server.url + "/health").status_code == 200
    finally:
        for s in idle:
            s.close()
    assert _wait_for(lambda: httpx.get(server.url + "/v1/models", headers={"X-Api-Key": KEY}).status_code == 200, 5)


# --- 10. browser-origin attacks --------------------------------------------------------------------

def test_10_a_rebinding_page_is_refused(server):
    """A text/plain POST from a foreign page, to a name that resolves to 127.0.0.1."""
    r = httpx.post(server.url + C, content=b'{"prompt": "hi", "max_tokens": 2}',
                   headers={"Content-Type": "text/plain", "Origin": "http://attacker.example",
                            "Host": "attacker.example", "X-Api-Key": KEY})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_host"
    for host in (f"localhost:{server.port}", f"127.0.0.1:{server.port}", f"[::1]:{server.port}"):
        assert httpx.get(server.url + "/health", headers={"Host": host}).status_code == 200, host


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_10_post_bodies_must_be_json(http, content_type):
    headers = {"Content-Type": content_type} if content_type else {}
    r = http.post(C, content=b'{"prompt": "hi", "max_tokens": 2}', headers=headers)
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"


def test_10_foreign_origins_are_refused_and_the_allowed_one_gets_cors(server, http):
    evil = http.post(C, json={"prompt": "hi", "max_tokens": 2}, headers={"Origin": "http://evil.example"})
    assert evil.status_code == 403 and evil.json()["error"]["code"] == "origin_not_allowed"
    same = http.post(C, json={"prompt": "hi", "max_tokens": 2}, headers={"Origin": server.url})
    assert same.status_code == 200
    preflight = httpx.options(server.url + C, headers={"Origin": WEB, "Access-Control-Request-Method": "POST",
                                                       "Access-Control-Request-Headers": "content-type,x-api-key"})
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == WEB
    allowed = http.post(C, json={"prompt": "hi", "max_tokens": 2}, headers={"Origin": WEB})
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == WEB


# --- 11. the API key off the command line; names, not paths --------------------------------------------

def test_11_the_key_comes_from_the_environment_and_either_header(server):
    assert KEY.encode() not in Path(f"/proc/{server.proc.pid}/cmdline").read_bytes()
    assert httpx.get(server.url + "/v1/models").status_code == 401
    assert httpx.get(server.url + "/v1/models", headers={"X-Api-Key": "wrong"}).status_code == 401
    assert httpx.get(server.url + "/v1/models", headers={"X-Api-Key": KEY}).status_code == 200
    assert httpx.get(server.url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


def test_11_models_names_files_not_paths(http):
    info = http.get("/v1/models").json()["data"][0]["specserve"]
    assert (info["target"], info["draft"]) == ("tiny.gguf", "tiny_draft.gguf")


# --- 12. llama-server's seed -1 and cache_prompt ----------------------------------------------------

def test_12_llama_seed_minus_one_means_random(http):
    r = http.post(L, json={"prompt": "the cat", "n_predict": 4, "temperature": 0.8, "seed": -1})
    assert r.status_code == 200, r.text
    assert http.post(C, json={"prompt": "the cat", "max_tokens": 4, "seed": -1}).status_code == 400  # OpenAI's: no


def test_12_cache_prompt_false_evaluates_the_whole_prompt(http):
    body = {"prompt": "the cat sat on the mat and looked at the dog", "n_predict": 4}
    http.post(L, json=body)
    assert http.post(L, json=body).json()["timings"]["cache_n"] > 0
    fresh = http.post(L, json={**body, "cache_prompt": False}).json()
    assert fresh["timings"]["cache_n"] == 0 and fresh["timings"]["prompt_n"] == fresh["tokens_evaluated"]


# --- 9. the drain has a deadline (own servers) ------------------------------------------------------

def _drain_scene(srv, headers: dict, signals: int) -> tuple[list[str], httpx.Response | None, float]:
    """A long stream holding the one slot and a request queued behind it; then `signals` SIGTERMs.
    Returns the stream's data lines, the queued request's answer, and seconds from the first signal to exit."""
    got, first = {}, threading.Event()

    def stream():
        with httpx.Client(base_url=srv.url, headers=headers, timeout=120) as c, \
                c.stream("POST", C, json={**LONG, "max_tokens": 16000}) as r:
            lines = []
            for line in r.iter_lines():
                if line.startswith("data: "):
                    first.set()
                    lines.append(line[6:])
            got["stream"] = lines

    def queued():
        got["queued"] = httpx.post(srv.url + C, json={"prompt": "the dog", "max_tokens": 8}, headers=headers,
                                   timeout=120)

    a, b = threading.Thread(target=stream), threading.Thread(target=queued)
    a.start()
    assert first.wait(30)
    b.start()
    assert _wait_for(lambda: _health(srv)["queue_depth"] == 1)
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    assert _wait_for(lambda: _health(srv)["status"] == "draining", 10)
    if signals == 2:
        srv.proc.send_signal(signal.SIGTERM)
    a.join(120)
    b.join(120)
    assert srv.proc.wait(60) == 0
    return got.get("stream", []), got.get("queued"), time.monotonic() - t0


def _ended_by_the_drain(events: list[str], queued: httpx.Response | None) -> None:
    assert events and events[-1] != "[DONE]"
    assert json.loads(events[-1])["error"]["code"] == "draining"
    assert queued is not None and queued.status_code == 503 and queued.json()["error"]["code"] == "draining"


def test_9_the_drain_ends_streams_cleanly_at_its_deadline(tiny_models_dir, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# one key per line\nfirst-key\n\nsecond-key\n")
    srv = ServerProcess(serve_args(tiny_models_dir, "-c", "16384", "--parallel", "1", "--queue", "1",
                                   "--drain-timeout", "1", "--api-key-file", str(keys)), tmp_path / "serve.log")
    try:
        assert httpx.get(srv.url + "/v1/models", headers={"X-Api-Key": "first-key"}).status_code == 200
        events, queued, seconds = _drain_scene(srv, {"Authorization": "Bearer second-key"}, signals=1)
        _ended_by_the_drain(events, queued)
        assert seconds < 15
        assert "drain deadline" in srv.log()
    finally:
        srv.stop()


def test_9_a_second_signal_ends_the_drain_at_once(tiny_models_dir, tmp_path):
    srv = ServerProcess(serve_args(tiny_models_dir, "-c", "16384", "--parallel", "1", "--queue", "1",
                                   "--drain-timeout", "600", "--api-key", ""), tmp_path / "serve.log")
    try:
        preflight = httpx.options(srv.url + C, headers={"Origin": WEB, "Access-Control-Request-Method": "POST"})
        assert "access-control-allow-origin" not in preflight.headers  # CORS is off by default
        events, queued, seconds = _drain_scene(srv, {}, signals=2)
        _ended_by_the_drain(events, queued)
        assert seconds < 15
        assert "authentication is off" in srv.log()
    finally:
        srv.stop()
