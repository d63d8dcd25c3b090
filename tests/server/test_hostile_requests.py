"""What a hostile client found in the third round (issue 50): grammar bombs, tenants reading each
other's prompt cache, answers that look like success and are not, connection limits behind a proxy.

One server for most tests: tiny models with Qwen2.5's tool template, two slots, keys from a file
(two confined to scopes of their own, one not). The connection tests start their own servers.
"""
from __future__ import annotations

import json
import socket
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from server_fixtures import ServerProcess, post, serve_args, tiny_tools_pair  # noqa: E402

pytestmark = pytest.mark.server

ADMIN, KEY_A, KEY_B = "admin-key", "key-of-tenant-a", "key-of-tenant-b"
C, CH, L = "/v1/completions", "/v1/chat/completions", "/completion"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    tiny_tools_pair(d)
    keys = d / "keys"
    keys.write_text(f"{KEY_A} scope=tA\n{KEY_B} scope=tB\n{ADMIN}\n")
    srv = ServerProcess(serve_args(d, "-c", "2048", "--parallel", "2", "--api-key-file", str(keys)), d / "serve.log")
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in srv.log()


def client(srv, key: str = ADMIN) -> httpx.Client:
    return httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {key}"}, timeout=120)


@pytest.fixture(scope="module")
def http(server):
    with client(server) as c:
        yield c


def _error(r: httpx.Response, status: int, param: str, code: str) -> str:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert (err["param"], err["code"]) == (param, code), err
    return err["message"]


def chain_gbnf(n: int) -> str:
    return "\n".join(["root ::= r0", *(f'r{i} ::= "x{i}" | r{i + 1}' for i in range(n)), f'r{n} ::= "end"'])


def props(n: int) -> dict:
    return {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)}}


CHAT = {"messages": [{"role": "user", "content": "Give me JSON."}], "max_tokens": 8}
BOMBS = {
    "5,000 chained GBNF rules": (L, {"prompt": "x", "n_predict": 8, "grammar": chain_gbnf(5000)}, "grammar",
                                 "bytes of grammar text"),
    "10,000 properties": (CH, {**CHAT, "response_format": {"type": "json_schema", "json_schema": {
        "name": "big", "schema": props(10_000)}}}, "response_format.json_schema.schema", "properties of one object"),
    "15,000 properties": (L, {"prompt": "x", "n_predict": 8, "json_schema": props(15_000)}, "json_schema",
                          "properties of one object"),
    "50,000 GBNF alternatives": (L, {"prompt": "x", "n_predict": 8, "grammar": "root ::= " + " | ".join(
        f'"w{i}"' for i in range(50_000))}, "grammar", "bytes of grammar text"),
    "a tool of 10,000 parameters": (CH, {**CHAT, "tool_choice": "required", "tools": [
        {"type": "function", "function": {"name": "f", "parameters": props(10_000)}}]},
        "tools[0].function.parameters", "properties of one object"),
    "200 tools": (CH, {**CHAT, "tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(200)]},
                  "tools", "tools in a request"),
    "a chain of 2,000 $refs": (L, {"prompt": "x", "n_predict": 8, "json_schema": {"$ref": "#/$defs/d0", "$defs": {
        **{f"d{i}": {"anyOf": [{"type": "integer"}, {"$ref": f"#/$defs/d{i + 1}"}]} for i in range(2000)},
        "d2000": {"type": "string"}}}}, "json_schema", "$refs in a schema"),
}


@pytest.mark.parametrize("name", BOMBS)
def test_a_grammar_bomb_is_a_400_naming_the_limit_and_the_server_lives(server, http, name):
    path, body, param, limit = BOMBS[name]
    message = _error(http.post(path, json=body), 400, param, "invalid_grammar")
    assert f"({limit})" in message, message
    assert http.get("/health").status_code == 200
    assert http.post(L, json={"prompt": "x", "n_predict": 2}).status_code == 200


def test_health_and_streams_go_on_while_a_large_schema_compiles(server, http):
    """Ordering, not speed: /health answers, and a stream running beside gets tokens, while the compile
    of a large schema (within the limits) is still under way."""
    big = {"type": "object", "properties": {f"o{j}": props(900) for j in range(5)}}
    done = threading.Event()
    answers: list[httpx.Response] = []

    def compile_it():
        with client(server) as c:
            answers.append(c.post(L, json={"prompt": "x", "n_predict": 4, "json_schema": big}))
        done.set()

    with client(server) as c, c.stream("POST", C, json={"prompt": "a b c", "max_tokens": 1900, "ignore_eos": True,
                                                        "stream": True}) as stream:
        lines = stream.iter_lines()
        next(lines)
        thread = threading.Thread(target=compile_it)
        thread.start()
        health_during = tokens_during = 0
        for line in lines:
            if done.is_set():
                break
            tokens_during += line.startswith("data: {")
            health_during += http.get("/health").status_code == 200 and not done.is_set()
        thread.join()
    assert answers[0].status_code == 200, answers[0].text
    assert health_during >= 1 and tokens_during >= 1, (health_during, tokens_during)


@pytest.mark.parametrize("schema", [
    {"$ref": "#"},
    {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
])
def test_a_schema_no_text_satisfies_is_a_400_before_anything_runs(http, schema):
    message = _error(http.post(L, json={"prompt": "x", "n_predict": 8, "json_schema": schema}), 400, "json_schema",
                     "invalid_grammar")
    assert "allows no output" in message


DEAD_END = 'root ::= "ab" r\nr ::= "c" r'  # forces c's without end: llguidance gives up a few tokens in


def test_a_grammar_that_dead_ends_while_generating_is_an_error_not_a_200(http):
    _error(http.post(L, json={"prompt": "x", "n_predict": 400, "grammar": DEAD_END}), 400, "grammar",
           "grammar_dead_end")
    r = http.post(C, json={"prompt": "x", "max_tokens": 400, "grammar": DEAD_END, "stream": True})
    if r.status_code == 400:  # it dead-ended in the first step, before the headers
        assert r.json()["error"]["code"] == "grammar_dead_end"
        return
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert "[DONE]" not in events
    last = json.loads(events[-1])
    assert last["error"]["code"] == "grammar_dead_end" and last["error"]["param"] == "grammar", last
    assert all(c["finish_reason"] is None for e in events[:-1] for c in json.loads(e)["choices"])


def test_json_schema_true_is_any_json(http):
    r = http.post(L, json={"prompt": "x", "n_predict": 12, "json_schema": True})
    assert r.status_code == 200, r.text
    if r.json()["stop_type"] == "eos":
        json.loads(r.json()["content"])
    _error(http.post(L, json={"prompt": "x", "n_predict": 4, "json_schema": False}), 400, "json_schema",
           "invalid_grammar")


@pytest.mark.parametrize("field", ["verify", "draft_max", "mode"])
def test_a_speculation_field_at_the_top_level_is_refused_not_ignored(http, field):
    value = {"verify": "rejection", "draft_max": 2, "mode": "none"}[field]
    message = _error(http.post(C, json={"prompt": "x", "max_tokens": 2, field: value}), 400, field,
                     "unsupported_parameter")
    assert f'"speculative": {{"{field}"' in message
    assert http.post(C, json={"prompt": "x", "max_tokens": 2, "speculative": {field: value}}).status_code == 200


def _cached(srv, key: str, prompt: str) -> int:
    with client(srv, key) as c:
        return post(c, L, {"prompt": prompt, "n_predict": 1})["tokens_cached"]


def test_a_tenant_never_finds_another_tenant_s_prompt_in_the_cache(server):
    for word, guess in (("Tuesday", "PERIWINKLE-4471"), ("Wednesday", "MARIGOLD-1234")):
        secret = f"{word}: the code word for the vault is PERIWINKLE-4471, and the rest of it is long enough."
        assert _cached(server, KEY_A, secret) == 0
        assert _cached(server, KEY_B, secret.replace("PERIWINKLE-4471", guess)) == 0  # right or wrong guess alike
        assert _cached(server, KEY_A, secret + " More.") > 10  # a tenant's own prompt is still reused


def test_metrics_show_a_scoped_key_its_own_requests_only(server, http):
    def requests(key: str) -> float:
        with client(server, key) as c:
            text = c.get("/metrics").text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("specserve:requests_total{"))

    before = {k: requests(k) for k in (ADMIN, KEY_A, KEY_B)}
    _cached(server, KEY_A, "one request of tenant A")  # accounted before its answer is sent (Job.finished)
    after = {k: requests(k) for k in (ADMIN, KEY_A, KEY_B)}
    assert after[KEY_A] == before[KEY_A] + 1 and after[ADMIN] == before[ADMIN] + 1
    assert after[KEY_B] == before[KEY_B]
    with client(server, KEY_B) as c:
        assert "batch_sequences" not in c.get("/metrics").text  # no server-wide families either


# --- connection limits: /health past the per-client limit, a trusted proxy ----------------------------------

@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    d = tmp_path_factory.mktemp("limited")
    tiny_tools_pair(d)
    srv = ServerProcess(serve_args(d, "-c", "2048", "--parallel", "2", "--max-connections-per-client", "2",
                                   "--trusted-proxy", "127.0.0.2"), d / "serve.log")
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in srv.log()


def _request(srv, path: str, source: str = "127.0.0.1", headers: str = "") -> bytes:
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10, source_address=(source, 0)) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{headers}\r\n".encode())
        answer = b""
        while part := s.recv(65536):
            answer += part
        return answer


def test_health_is_answered_however_many_connections_a_client_holds(limited):
    held = [socket.create_connection(("127.0.0.1", limited.port), timeout=10) for _ in range(2)]
    try:
        time.sleep(0.2)
        assert _request(limited, "/health").startswith(b"HTTP/1.1 200")
        answer = _request(limited, "/v1/models")
        assert answer.startswith(b"HTTP/1.1 503") and b"too_many_connections" in answer
    finally:
        for s in held:
            s.close()


def test_a_trusted_proxy_s_clients_are_limited_by_their_forwarded_address(limited):
    held = [socket.create_connection(("127.0.0.1", limited.port), timeout=10, source_address=("127.0.0.2", 0))
            for _ in range(3)]  # the proxy's own connections are not limited per client
    body = {"prompt": "a b c", "max_tokens": 1800, "ignore_eos": True, "stream": True}
    try:
        time.sleep(0.2)
        assert _request(limited, "/v1/models", "127.0.0.2").startswith(b"HTTP/1.1 200")
        proxy = httpx.Client(base_url=limited.url, timeout=60, transport=httpx.HTTPTransport(local_address="127.0.0.2"))
        with proxy, proxy.stream("POST", C, json=body, headers={"X-Forwarded-For": "10.0.0.7"}) as one, \
                proxy.stream("POST", C, json=body, headers={"X-Forwarded-For": "10.0.0.7, 127.0.0.2"}) as two:
            lines = one.iter_lines(), two.iter_lines()  # held: a dropped iterator closes its stream
            next(lines[0]), next(lines[1])  # both in flight
            third = proxy.get("/v1/models", headers={"X-Forwarded-For": "10.0.0.7"})
            assert third.status_code == 503 and third.json()["error"]["code"] == "too_many_connections"
            assert proxy.get("/v1/models", headers={"X-Forwarded-For": "10.0.0.8"}).status_code == 200
            assert proxy.get("/health", headers={"X-Forwarded-For": "10.0.0.7"}).status_code == 200
            spoofed = _request(limited, "/v1/models", "127.0.0.1", "X-Forwarded-For: 10.0.0.7\r\n")
            assert spoofed.startswith(b"HTTP/1.1 200")  # from an untrusted address the header means nothing
    finally:
        for s in held:
            s.close()


def test_a_compile_past_its_time_budget_is_a_400_naming_the_field():
    import asyncio

    from specserve.grammar import GrammarWorker
    from specserve.server.core.constraints.compiling import compile_off_loop
    from specserve.server.http.errors import ApiError

    worker = GrammarWorker(threads=1)
    try:
        with pytest.raises(ApiError) as e:
            asyncio.run(compile_off_loop(worker, "json_schema", time.sleep, 2, budget=0.1))
        assert (e.value.status, e.value.param, e.value.code) == (400, "json_schema", "invalid_grammar")
        assert "took over 0.1 s" in e.value.message
    finally:
        worker.close()
