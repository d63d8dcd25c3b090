"""Connections against the real server: what slow, stalled, vanishing or greedy clients cannot do.

A 500 leaves the keep-alive connection usable (the app in-process, where a bug can be planted); clients that
give up while queued are dropped before their prompt runs, and streams dropped and resent at once are not refused;
slowloris headers and stalled bodies meet the read timeout; connections beyond the cap get 503 (the guarded
server: one slot, a queue of two, 2 s read timeout, 8 connections); a connection that sends no request line is
closed soon, and one client address cannot take every connection (the limited server). See
defended_servers for both.
"""
from __future__ import annotations

import json
import select
import socket
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from server_fixtures import free_port, tiny_models_dir  # noqa: E402,F401

from defended_servers import (C, KEY, LONG, http, server, health, limited_server,  # noqa: E402,F401
                              wait_for)
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

pytestmark = pytest.mark.server


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


# --- a 500 leaves the keep-alive connection usable ----------------------------------------------------------

def test_after_a_500_the_connection_still_serves(tiny_models_dir, monkeypatch):
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
        assert wait_for(lambda: server.started, 30)
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


# --- a client that gives up while queued is dropped ---------------------------------------------------------

def test_clients_that_give_up_in_the_queue_are_dropped(server, http):
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
        assert wait_for(lambda: health(server)["queue_depth"] == 0, 5), health(server)

        # The queue (2) has room again: two new requests wait for the slot instead of getting 503.
        answers = []
        waiting = [threading.Thread(target=lambda: answers.append(
            http.post(C, json={"prompt": "a real one", "max_tokens": 4}))) for _ in range(2)]
        for t in waiting:
            t.start()
        assert wait_for(lambda: health(server)["queue_depth"] == 2, 10), health(server)
    finally:
        long.stop()
    for t in waiting:
        t.join(60)
    assert [r.status_code for r in answers] == [200, 200]
    assert wait_for(lambda: health(server)["requests_active"] == 0, 10)
    assert _requests_total(http) - before == 3, "a ghost ran its prompt"  # the long stream and the two


def test_streams_dropped_and_resent_at_once_get_no_503(server):
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


# --- slow and stalled clients; the connection cap -----------------------------------------------------------

def test_a_slowloris_connection_is_closed(server):
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


def test_a_stalled_body_gets_408(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        t0 = time.monotonic()
        answer = _raw(s, _post_head(C, server.port, 100, f"X-Api-Key: {KEY}\r\n"), b'{"prompt": ')
        assert answer is not None and answer[0] == 408, answer
        assert json.loads(answer[2])["error"]["code"] == "request_timeout" and time.monotonic() - t0 < 6


def test_connections_beyond_the_cap_get_503(server):
    """Beyond the cap every request gets 503 but /health (issue 39: a prober must not see a dead server)."""
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(8)]
    try:
        r = httpx.get(server.url + "/v1/models", headers={"X-Api-Key": KEY})
        assert r.status_code == 503 and r.json()["error"]["code"] == "too_many_connections"
        assert httpx.get(server.url + "/health").status_code == 200
    finally:
        for s in idle:
            s.close()
    assert wait_for(lambda: httpx.get(server.url + "/v1/models", headers={"X-Api-Key": KEY}).status_code == 200, 5)


# --- idle connections and a cap a client address (the limited server) ---------------------------------------

@pytest.fixture(scope="module")
def limited(tiny_models_dir, tmp_path_factory):
    with limited_server(tiny_models_dir, tmp_path_factory.mktemp("limited") / "serve.log") as srv:
        yield srv


def _closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closes `sock` (reading whatever it sends first), or None."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        if select.select([sock], [], [], 0.1)[0]:
            try:
                if sock.recv(65536) == b"":
                    return time.monotonic() - t0
            except ConnectionResetError:
                return time.monotonic() - t0
    return None


def _connect(srv, source: str = "127.0.0.1") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10, source_address=(source, 0))
    return s


def _started(srv, source: str = "127.0.0.1") -> socket.socket:
    """A connection that sent its request line and then stalls (its headers never end)."""
    s = _connect(srv, source)
    s.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\n".encode())
    return s


def test_a_connection_that_sends_no_request_line_is_closed_soon(limited):
    with _connect(limited) as idle, _started(limited) as started:
        seconds = _closed_within(idle, 3)
        assert seconds is not None and seconds < 2.5, seconds  # --request-line-timeout 1, not --read-timeout 4
        assert _closed_within(started, 0.5) is None  # its request line came: it has the read timeout
    with _connect(limited) as half:
        half.sendall(b"GET /heal")  # a request line never finished counts as none
        seconds = _closed_within(half, 3)
        assert seconds is not None and seconds < 2.5, seconds


def test_one_client_address_cannot_take_every_connection(limited):
    held = [_started(limited) for _ in range(3)]
    try:
        with _connect(limited) as extra:
            answer = extra.recv(65536)
            assert answer.startswith(b"HTTP/1.1 503") and b"too_many_connections" in answer, answer
            assert _closed_within(extra, 3) is not None
        held += [_connect(limited) for _ in range(8)]  # refused, not yet closed: they take no place of the 8
        other = httpx.Client(base_url=limited.url, transport=httpx.HTTPTransport(local_address="127.0.0.2"))
        with other:  # another address is served, /health and the rest
            assert other.get("/health").status_code == 200
            assert other.post(C, json={"prompt": "hi", "max_tokens": 2}).status_code == 200
    finally:
        for s in held:
            s.close()
    deadline = time.monotonic() + 5  # the server sees the closes a moment later
    while not _health_ok(limited):
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _health_ok(srv) -> bool:
    try:
        return httpx.get(srv.url + "/health").status_code == 200
    except httpx.TransportError:
        return False
