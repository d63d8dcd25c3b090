"""bench.endpoint.native_stream against a real socket that misbehaves as llama-server's connections do: a
kept-alive connection closed before it answered is sent again; a stream cut part-way is an error."""
from __future__ import annotations

import json
import socket
import threading

import httpx
import pytest

from specserve.bench.endpoint import EndpointError, native_stream

EVENTS = [{"content": "a", "stop": False}, {"content": "b", "stop": False},
          {"content": "", "stop": True, "tokens_predicted": 2, "timings": {"predicted_n": 2}}]


def _sse(events) -> bytes:
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    return b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % len(body) + body


def _read_request(conn: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        body += conn.recv(65536)


class Scripted:
    """A listening socket that answers its connections in turn: "close" (closes without a word), "cut" (headers
    and one event of a longer body, then closes), "ok" (the whole stream)."""

    def __init__(self, script: list[str]):
        self.script, self.served = list(script), []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.url = "http://127.0.0.1:%d/completion" % self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while self.script:
            conn, _ = self.sock.accept()
            with conn:
                _read_request(conn)  # all of it: closing on unread bytes would reset the connection instead
                how = self.script.pop(0)
                self.served.append(how)
                if how == "ok":
                    conn.sendall(_sse(EVENTS))
                elif how == "cut":
                    whole = _sse(EVENTS)
                    conn.sendall(whole[: whole.index(b"\n\n", whole.index(b"data:")) + 2])


def test_a_connection_closed_before_it_answered_is_sent_again():
    srv = Scripted(["close", "ok"])
    with httpx.Client(timeout=10) as client:
        got = list(native_stream(client, srv.url, {"prompt": "x", "stream": True}))
    assert [e for _, e in got] == EVENTS and srv.served == ["close", "ok"]
    assert all(t >= 0 for t, _ in got) and [t for t, _ in got] == sorted(t for t, _ in got)


def test_a_stream_cut_part_way_is_an_error_not_sent_again():
    srv = Scripted(["cut", "ok"])
    seen = []
    with httpx.Client(timeout=10) as client, pytest.raises(EndpointError, match="part-way"):
        for _, event in native_stream(client, srv.url, {"prompt": "x", "stream": True}):
            seen.append(event)
    assert seen == EVENTS[:1] and srv.served == ["cut"]


def test_twice_closed_is_one_clear_error():
    srv = Scripted(["close", "close"])
    with httpx.Client(timeout=10) as client, pytest.raises(EndpointError, match=srv.url):
        list(native_stream(client, srv.url, {"prompt": "x"}))
    assert srv.served == ["close", "close"]
