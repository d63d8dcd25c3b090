"""Issue 63's storm: clients over every API with the hardening round's bombs mixed in (run through
`python -m specserve.measure.hostile --storm SECONDS`; the module docstring there says what it reports)."""
from __future__ import annotations

import json
import multiprocessing
import random
import threading
import time
from collections import Counter
from pathlib import Path

import httpx


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
