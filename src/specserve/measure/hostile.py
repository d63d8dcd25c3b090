"""Issue 50's hostile requests against a running server, and what each did to everyone else.

    python -m specserve.measure.hostile --url http://127.0.0.1:8080 [--key KEY] [--tenant-keys A B]

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

    python -m specserve.measure.hostile --key ADMIN --tenant-keys A B --skip-bombs --storm 180 --clients 12
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
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
        from .storm import storm

        report = storm(args.url.rstrip("/"), *args.tenant_keys, args.storm, args.clients, args.bomb_share,
                       args.max_requests, args.pid)
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        return 0 if report["5xx"] == 0 and report["invalid_sse"] == 0 else 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
