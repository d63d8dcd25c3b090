"""Issue 50's hostile requests against a running server, and what each did to everyone else.

    python -m specserve.tools.hostile --url http://127.0.0.1:8080 [--key KEY] [--tenant-keys A B]

For each grammar bomb (5,000 chained GBNF rules; JSON schemas of 10,000 and 15,000 optional
properties; a GBNF of 50,000 alternatives; the 10k schema as a tool's parameters) and each schema
that cannot be satisfied (`{"$ref": "#"}`, a $ref cycle, a recursive schema with no way out): the
answer's status and code, the time it took, the slowest /health answer meanwhile (polled every
50 ms), the longest gap between tokens of a stream running beside it, and the server's RSS
before and after (from /health). With --tenant-keys (two keys of different scopes), the
cross-tenant probe: tenant A caches a prompt holding a secret; tenant B sends a right and a
wrong guess of it, and each answer's `tokens_cached` is printed. One JSON object per line.

The storm (issue 63's done-when): --storm SECONDS runs --clients clients over every API (plain and
streamed chat, completions, /completion, messages, responses, infill; tokenize, detokenize, apply-template,
slots, props, metrics), with the tenant keys in turn, and mixes in issue 63's bombs (storm_bombs) at
--bomb-share. A process of its own polls /health every 50 ms. It reports the requests, the 5xx, the
streams that are not valid SSE to their API's end, /health's p50/p99/max, the RSS at the start and
end (from /proc with --pid, else /health), and each bomb's statuses; bounded by --max-requests.

    python -m specserve.tools.hostile --key ADMIN --tenant-keys A B --skip-bombs --storm 180 --clients 12
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx


def chain_gbnf(n: int) -> str:
    return "\n".join(["root ::= r0", *(f'r{i} ::= "x{i}" | r{i + 1}' for i in range(n)), f'r{n} ::= "end"'])


def props(n: int) -> dict:
    return {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)}}


def bombs() -> dict[str, tuple[str, dict]]:
    """name -> (path, body); each body's output constraint is the bomb."""
    chat = {"messages": [{"role": "user", "content": "Give me a JSON object."}], "max_tokens": 16}
    return {
        "gbnf_5000_chained_rules": ("/completion", {"prompt": "x", "n_predict": 8, "grammar": chain_gbnf(5000)}),
        "schema_10k_properties": ("/v1/chat/completions", {**chat, "response_format": {
            "type": "json_schema", "json_schema": {"name": "big", "schema": props(10_000)}}}),
        "schema_15k_properties": ("/completion", {"prompt": "x", "n_predict": 8, "json_schema": props(15_000)}),
        "gbnf_50k_alternatives": ("/completion", {
            "prompt": "x", "n_predict": 8, "grammar": "root ::= " + " | ".join(f'"w{i}"' for i in range(50_000))}),
        "tool_10k_properties": ("/v1/chat/completions", {**chat, "tool_choice": "required", "tools": [
            {"type": "function", "function": {"name": "f", "parameters": props(10_000)}}]}),
        "schema_ref_self": ("/completion", {"prompt": "x", "n_predict": 16, "json_schema": {"$ref": "#"}}),
        "schema_ref_cycle": ("/completion", {"prompt": "x", "n_predict": 16, "json_schema": {
            "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}}),
        "schema_unsatisfiable_recursive": ("/completion", {"prompt": "x", "n_predict": 64, "json_schema": {
            "type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}}),
    }


class Watch:
    """Poll /health and run one stream while a request runs: the slowest poll, the longest token gap."""

    def __init__(self, url: str, headers: dict):
        self.url, self.headers = url, headers
        self.health_max = self.gap_max = 0.0
        self.stream_tokens = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._health), threading.Thread(target=self._stream)]

    def __enter__(self):
        for t in self._threads:
            t.start()
        deadline = time.monotonic() + 60
        while self.stream_tokens < 3 and time.monotonic() < deadline:  # the stream under way
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self._stop.set()
        for t in self._threads:
            t.join()

    def _health(self) -> None:
        with httpx.Client(timeout=300) as c:
            while not self._stop.is_set():
                t = time.perf_counter()
                c.get(self.url + "/health")
                self.health_max = max(self.health_max, time.perf_counter() - t)
                time.sleep(0.05)

    def _stream(self) -> None:
        body = {"prompt": "Once upon a time", "max_tokens": 3000, "ignore_eos": True, "stream": True}
        with httpx.Client(timeout=300, headers=self.headers) as c:
            with c.stream("POST", self.url + "/v1/completions", json=body) as r:
                last = time.perf_counter()
                for line in r.iter_lines():
                    if self._stop.is_set():
                        break
                    if line.startswith("data: {"):
                        now = time.perf_counter()
                        self.gap_max, last = max(self.gap_max, now - last), now
                        self.stream_tokens += 1


def rss_mib(c: httpx.Client) -> float:
    return round(c.get("/health").json().get("rss_bytes", 0) / (1 << 20), 1)


def run_bombs(url: str, headers: dict, only: list[str] | None = None) -> None:
    with httpx.Client(base_url=url, timeout=600, headers=headers) as c:
        rss0 = rss_mib(c)
        for name, (path, body) in bombs().items():
            if only and name not in only:
                continue
            data = json.dumps(body).encode()  # encoded before: the watch's threads share this process
            with Watch(url, headers) as w:
                t = time.perf_counter()
                try:
                    r = c.post(path, content=data, headers={"Content-Type": "application/json"})
                    status, answer = r.status_code, r.json()
                except httpx.TransportError as e:
                    status, answer = None, {"error": {"code": f"transport error: {e}"}}
                seconds = time.perf_counter() - t
            err = answer.get("error") or {}
            print(json.dumps({"request": name, "status": status, "code": err.get("code"),
                              "message": (err.get("message") or "")[:160], "seconds": round(seconds, 2),
                              "content": None if err else str(answer.get("content", answer.get("choices")))[:80],
                              "health_max_s": round(w.health_max, 3), "stream_gap_max_s": round(w.gap_max, 3),
                              "rss_mib": rss_mib(c), "rss_start_mib": rss0}), flush=True)


def tenant_probe(url: str, key_a: str, key_b: str) -> None:
    """Each round: A's prompt holds a secret; B sends it with a guess in its place. A round starts with
    a word of its own, so B's cache of its earlier guesses shares nothing with this one."""

    def ask(key: str, prompt: str) -> int:
        r = httpx.post(url + "/completion", json={"prompt": prompt, "n_predict": 1},
                       headers={"Authorization": f"Bearer {key}"}, timeout=120)
        r.raise_for_status()
        return r.json()["tokens_cached"]

    for word, right in (("Tuesday", True), ("Wednesday", False), ("Thursday", True), ("Friday", False)):
        secret = f"{word}: the code word for the vault is PERIWINKLE-SUNRISE-4471. Keep it safe."
        guess = "PERIWINKLE-SUNRISE-4471" if right else "MARIGOLD-SUNSET-1234"
        ask(key_a, secret)  # tenant A's prompt in a slot's cache
        cached = ask(key_b, secret.replace("PERIWINKLE-SUNRISE-4471", guess))
        print(json.dumps({"request": "cross_tenant_guess", "guess_right": right, "tokens_cached": cached}))


# The storm: every API under --clients clients, issue 63's bombs mixed in.

HI = [{"role": "user", "content": "Write one short sentence about the sea."}]
SECRET = {"prompt": "the cat", "n_predict": 4, "id_slot": 0, "grammar": 'root ::= "SECRET-GRAMMAR"',
          "stop": ["STOP-SECRET-XYZ"]}


def _body(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def storm_requests(rng: random.Random, skip: frozenset = frozenset()) -> tuple[str, str, dict, bool]:
    """One ordinary request: (method, path, body, streamed); none to the paths in `skip`."""
    n, stream = rng.randint(4, 32), rng.random() < 0.5
    kinds = [
        ("/v1/chat/completions", {"messages": HI, "max_tokens": n}),
        ("/v1/completions", {"prompt": "The sea is", "max_tokens": n}),
        ("/completion", {"prompt": "The sea is", "n_predict": n}),
        ("/v1/messages", {"model": "x", "messages": HI, "max_tokens": n}),
        ("/v1/responses", {"model": "x", "input": "Write one short sentence about the sea.", "max_output_tokens": n}),
        ("/infill", {"input_prefix": "def add(a, b):\n    ", "input_suffix": "\n", "n_predict": n}),
    ]
    path, body = rng.choice([k for k in kinds if k[0] not in skip])
    if rng.random() < 0.2:
        return rng.choice([("POST", "/tokenize", {"content": "The sea is wide.", "with_pieces": True}, False),
                           ("POST", "/detokenize", {"tokens": [1, 2, 3]}, False),
                           ("POST", "/apply-template", {"messages": HI}, False),
                           ("GET", "/slots", {}, False), ("GET", "/props", {}, False),
                           ("GET", "/metrics", {}, False)])
    return "POST", path, {**body, "stream": stream and path != "/infill"}, stream and path != "/infill"


def sse_valid(text: str, path: str) -> bool:
    """Whether a whole stream is SSE its API's client can read to its end: every line an `event:`, a
    comment or `data:` with JSON (or OpenAI's [DONE]), no error event, and the API's last event."""
    data = []
    for line in text.split("\n"):
        if not line or line.startswith((":", "event: ")):
            continue
        if not line.startswith("data: "):
            return False
        if line != "data: [DONE]":
            try:
                ev = json.loads(line[6:])
            except ValueError:
                return False
            if not isinstance(ev, dict) or "error" in ev or ev.get("type") == "error":
                return False
        data.append(line[6:])
    if not data:
        return False
    if path in ("/v1/chat/completions", "/v1/completions"):
        return data[-1] == "[DONE]"
    last = json.loads(data[-1])
    return {"/completion": last.get("stop") is True, "/v1/messages": last.get("type") == "message_stop",
            "/v1/responses": last.get("type") in ("response.completed", "response.incomplete")}.get(path, True)


class Bombs:
    """Issue 63's hostile requests, each a method that sends it and says what came back: (status, note).
    The big bodies are encoded once."""

    def __init__(self, url: str, key_a: str, key_b: str, n_vocab: int):
        self.url, self.key_a, self.key_b = url, key_a, key_b
        chat = {"messages": HI, "max_tokens": 4}
        self.bodies = {
            "logit_bias_120k_text_keys": ("/v1/chat/completions",
                                          _body({**chat, "logit_bias": {f"w{i}": 1 for i in range(120_000)}})),
            "logit_bias_1e308": ("/completion", _body({"prompt": "hi", "n_predict": 4, "logit_bias": [[28, 1e308]]})),
            "logit_bias_every_token_false": ("/completion", _body(
                {"prompt": "hi", "n_predict": 4, "logit_bias": [[t, False] for t in range(n_vocab)]})),
            "logit_bias_key_superscript_2": ("/v1/chat/completions", _body({**chat, "logit_bias": {"²": 1}})),
            "logit_bias_key_minus_minus_5": ("/v1/chat/completions", _body({**chat, "logit_bias": {"--5": 1}})),
            "responses_reasoning_content_5": ("/v1/responses", _body(
                {"model": "x", "max_output_tokens": 4, "input": [{"role": "user", "content": "hi"},
                                                                 {"type": "reasoning", "content": 5}]})),
            "apply_template_arguments_nan": ("/apply-template", _body({"messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "NaN"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "done"}]})),
            "responses_40k_one_word_items": ("/v1/responses", _body(
                {"model": "x", "max_output_tokens": 2, "input": [{"role": "user", "content": f"w{i}"}
                                                                 for i in range(40_000)]})),
            "tokenize_with_pieces_huge": ("/tokenize", _body({"content": "a " * 600_000, "with_pieces": True})),
            "detokenize_1m_ids": ("/detokenize", _body({"tokens": [1] * 1_000_000})),
        }
        self.predict = _body({"instances": [{"@requestFormat": "completion", "prompt": f"the cat {i}",
                                             "n_predict": 300, "ignore_eos": True} for i in range(128)]})
        self.resent = "the sea and the ship and the wind over the water " * 160  # ~1,800 tokens

    def names(self) -> list[str]:
        return [*self.bodies, "slots_read_by_another_tenant", "slots_erase_by_another_tenant",
                "predict_128_dropped_after_1s", "stream_dropped_after_5_chunks_resent"]

    def _headers(self, key: str) -> dict:
        return {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def send(self, name: str) -> tuple[int | str, str]:
        if name in self.bodies:
            path, data = self.bodies[name]
            r = httpx.post(self.url + path, content=data, headers=self._headers(self.key_a), timeout=300)
            return r.status_code, (r.json().get("error", {}).get("code") or "") if r.status_code >= 400 else ""
        return getattr(self, name)()

    def slots_read_by_another_tenant(self) -> tuple[int, str]:
        httpx.post(self.url + "/completion", content=_body(SECRET), headers=self._headers(self.key_a), timeout=300)
        r = httpx.get(self.url + "/slots", headers=self._headers(self.key_b), timeout=60)
        return r.status_code, "LEAK" if "SECRET" in r.text else "no secret"

    def slots_erase_by_another_tenant(self) -> tuple[int, str]:
        httpx.post(self.url + "/completion", content=_body(SECRET), headers=self._headers(self.key_a), timeout=300)
        r = httpx.post(self.url + "/slots/0?action=erase", headers=self._headers(self.key_b), timeout=300)
        return r.status_code, (r.json().get("error", {}).get("code") or "") if r.status_code >= 400 else "erased"

    def predict_128_dropped_after_1s(self) -> tuple[int | str, str]:
        try:
            r = httpx.post(self.url + "/predict", content=self.predict, headers=self._headers(self.key_a), timeout=1)
            return r.status_code, "answered within 1 s"
        except httpx.ReadTimeout:
            return "dropped", ""

    def stream_dropped_after_5_chunks_resent(self) -> tuple[int, str]:
        prompt = f"{random.random()} {self.resent}"
        body = {"prompt": prompt, "n_predict": 200, "ignore_eos": True, "stream": True}
        with httpx.Client(timeout=300, headers=self._headers(self.key_a)) as c:
            with c.stream("POST", self.url + "/completion", content=_body(body)) as s:
                chunks = 0
                for line in s.iter_lines():
                    chunks += line.startswith("data: ")
                    if chunks >= 5:
                        break
            r = c.post(self.url + "/completion", content=_body({"prompt": prompt, "n_predict": 1}))
        a = r.json()
        return r.status_code, f"tokens_cached {a.get('tokens_cached')} of {a.get('tokens_evaluated')}"


def _poll_health(url: str, pid: int | None, stop, out) -> None:
    """In a process of its own (the clients' threads would otherwise share its interpreter lock): /health
    every 50 ms, each poll's (start on the monotonic clock, seconds or None for a failure), and the RSS
    about every second, sent back at the end."""
    took, rss = [], []
    with httpx.Client(timeout=30) as c:
        while not stop.is_set():
            if not rss or time.monotonic() - rss[-1][0] >= 1:
                rss.append((time.monotonic(), _rss_mib(url, pid)))
            t = time.perf_counter()
            try:
                ok = c.get(url + "/health").status_code == 200
            except httpx.HTTPError:
                ok = False
            took.append((time.monotonic(), time.perf_counter() - t if ok else None))
            stop.wait(0.05)
    out.send((took, rss))


def _rss_mib(url: str, pid: int | None) -> float:
    if pid is not None:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    return round(httpx.get(url + "/health", timeout=30).json().get("rss_bytes", 0) / (1 << 20), 1)


def storm(url: str, key_a: str, key_b: str, seconds: float, clients: int, bomb_share: float,
          max_requests: int, pid: int | None, seed: int = 0) -> dict:
    """Run the storm; returns the report (also printed, a bomb a line, then the totals)."""
    msg = httpx.post(url + "/detokenize", json={"tokens": [10**9]}, headers={"Authorization": f"Bearer {key_a}"},
                     timeout=30).json()["error"]["message"]
    bombs = Bombs(url, key_a, key_b, int(msg.rsplit(", ", 1)[1].split(")")[0]))
    names = bombs.names()
    lock = threading.Lock()
    statuses: Counter = Counter()
    per_bomb: dict[str, Counter] = {n: Counter() for n in names}
    notes: dict[str, Counter] = {n: Counter() for n in names}
    sse = Counter()
    failures: Counter = Counter()
    count = [0, 0]  # requests sent, bombs sent
    spans: list[tuple[str, float, float]] = []  # (bomb, start, end) on the monotonic clock
    fim = httpx.post(url + "/infill", json={"input_prefix": "a", "input_suffix": "b", "n_predict": 1},
                     headers={"Authorization": f"Bearer {key_a}"}, timeout=60).status_code == 200
    skip = frozenset() if fim else frozenset({"/infill"})  # a model without FIM tokens: its 400 says nothing

    rss_fresh = _rss_mib(url, pid)
    with httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {key_a}"}) as c:
        rng = random.Random(-1)  # every API and bomb once or more: the RSS start is a served server's
        for method, path, body, _ in (storm_requests(rng, skip) for _ in range(16)):
            short = {k: 2 for k in ("max_tokens", "n_predict", "max_output_tokens") if k in body}
            c.request(method, path, json={**body, **short, "stream": False} if method == "POST" else None)
    warmup_bombs = {name: bombs.send(name) for name in names}
    time.sleep(2)
    rss_start = _rss_mib(url, pid)
    stop, (rx, tx) = multiprocessing.Event(), multiprocessing.Pipe(duplex=False)
    poller = multiprocessing.Process(target=_poll_health, args=(url, pid, stop, tx))
    poller.start()
    deadline = time.monotonic() + seconds

    def client(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        key = (key_a, key_b)[i % 2]
        with httpx.Client(base_url=url, timeout=300, headers={"Authorization": f"Bearer {key}"}) as c:
            while time.monotonic() < deadline:
                with lock:
                    if count[0] >= max_requests:
                        return
                    count[0] += 1
                    bomb = names[count[1] % len(names)] if rng.random() < bomb_share else None
                    count[1] += bomb is not None
                try:
                    if bomb:
                        t = time.monotonic()
                        status, note = bombs.send(bomb)
                        with lock:
                            spans.append((bomb, t, time.monotonic()))
                            per_bomb[bomb][status] += 1
                            notes[bomb][note] += 1
                            statuses[status] += 1
                        continue
                    method, path, body, streamed = storm_requests(rng, skip)
                    if streamed:
                        with c.stream("POST", path, json=body) as r:
                            text = r.read().decode("utf-8", "replace")
                        ok = r.status_code != 200 or sse_valid(text, path)
                        with lock:
                            sse["streams"] += 1
                            sse["invalid"] += not ok
                            if not ok:
                                failures[f"invalid SSE {path}: {text[-120:]!r}"] += 1
                    else:
                        r = c.request(method, path, json=body or None)
                    with lock:
                        statuses[r.status_code] += 1
                        if r.status_code >= 400:
                            failures[f"{r.status_code} {path}: {r.text[:120]}"] += 1
                except httpx.HTTPError as e:
                    with lock:
                        statuses["transport error"] += 1
                        failures[f"{type(e).__name__} {bomb or path}: {e}"[:160]] += 1

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    stop.set()
    took, rss = rx.recv()
    poller.join()
    time.sleep(2)  # the last dropped requests' slots given back
    health = sorted(t for _, t in took if t is not None)

    def health_during(name: str) -> float:
        return round(1000 * max((t for at, t in took if t is not None for b, t0, t1 in spans
                                 if b == name and t0 <= at <= t1), default=0.0), 1)

    def pct(q: float) -> float:
        return round(health[min(len(health) - 1, int(q * len(health)))] * 1000, 1) if health else 0.0

    for name in names:
        print(json.dumps({"bomb": name, "statuses": {str(k): v for k, v in per_bomb[name].items()},
                          "notes": dict(notes[name]), "health_max_ms_during": health_during(name)}), flush=True)
    report = {
        "seconds": round(elapsed, 1), "clients": clients, "requests": sum(statuses.values()),
        "bombs": count[1], "statuses": {str(k): v for k, v in sorted(statuses.items(), key=str)},
        "5xx": sum(v for k, v in statuses.items() if isinstance(k, int) and k >= 500),
        "streams": sse["streams"], "invalid_sse": sse["invalid"],
        "health_polls": len(took), "health_failed": sum(t is None for _, t in took),
        "health_p50_ms": pct(0.5), "health_p99_ms": pct(0.99), "health_max_ms": pct(1.0),
        "rss_fresh_mib": rss_fresh, "rss_start_mib": rss_start, "rss_end_mib": _rss_mib(url, pid),
        "rss_max_mib": max(m for _, m in rss), "rss_every_30s_mib": [m for _, m in rss[::30]],
        "failures": dict(failures.most_common(20)), "warmup_bombs": warmup_bombs,
    }
    print(json.dumps(report), flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--key", help="an API key for the bombs (an admin key or none)")
    p.add_argument("--tenant-keys", nargs=2, metavar=("KEY_A", "KEY_B"), help="two keys of different scopes")
    p.add_argument("--skip-bombs", action="store_true")
    p.add_argument("--only", action="append", choices=list(bombs()), help="send this one (repeatable)")
    p.add_argument("--storm", type=float, metavar="SECONDS", help="then the storm, this long (needs --tenant-keys)")
    p.add_argument("--clients", type=int, default=12, help="the storm's clients (default 12)")
    p.add_argument("--bomb-share", type=float, default=0.15, help="the storm's share of bombs (default 0.15)")
    p.add_argument("--max-requests", type=int, default=5000, help="the storm's bound on requests (default 5000)")
    p.add_argument("--pid", type=int, help="the server's process id, for its RSS from /proc")
    p.add_argument("--json", metavar="OUT", help="also write the storm's report as JSON")
    args = p.parse_args(argv)
    if args.storm and not args.tenant_keys:
        p.error("--storm needs --tenant-keys (the bombs read and erase one tenant's slot with the other's key)")
    headers = {"Authorization": f"Bearer {args.key}"} if args.key else {}
    if not args.skip_bombs:
        run_bombs(args.url.rstrip("/"), headers, args.only)
    if args.tenant_keys and not args.storm:
        tenant_probe(args.url.rstrip("/"), *args.tenant_keys)
    if args.storm:
        report = storm(args.url.rstrip("/"), *args.tenant_keys, args.storm, args.clients, args.bomb_share,
                       args.max_requests, args.pid)
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        return 0 if report["5xx"] == 0 and report["invalid_sse"] == 0 else 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
