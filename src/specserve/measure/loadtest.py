"""Load test a running server with mixed Spec-Bench chat requests.

    python -m specserve.measure.loadtest --url http://127.0.0.1:8080 --clients 8 --duration 60 \\
        --workload spec_bench [--prompts FILE] [--pid PID] [--json out.json]

--clients 1,2,4 runs one level after another (each for --duration) and reports each:
what batching buys is the aggregate tokens/s as clients grow, at what time per output token.

Each client loops until the duration is up: a random prompt, sent as a plain request,
a stream, or a stream it deliberately abandons after a few chunks (those are counted
as cancels, not errors). Reports requests/s, p50/p95 latency, generated tokens/s,
time per output token (p50/p95; streams: after the first token, plain requests: latency
over tokens), errors, speculation totals from /metrics, and the server's RSS before and after
(from /proc/PID/status with --pid, else from /health).
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from ..bench.workloads import load_workload


@dataclass
class Tally:
    """What the clients saw; appended to under a lock."""

    latencies: list[float] = field(default_factory=list)  # completed requests, seconds
    ttfts: list[float] = field(default_factory=list)  # streams: seconds to the first content
    tpots: list[float] = field(default_factory=list)  # seconds per output token, per completed request
    tokens: int = 0
    cancels: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # "status: message" -> count


def _rss(url: str, pid: int | None, headers: dict) -> int:
    if pid is not None:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return int(httpx.get(url + "/health", headers=headers, timeout=10).json().get("rss_bytes", 0))


def _spec_totals(url: str, headers: dict) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics", headers=headers, timeout=10).text):
        for s in fam.samples:
            name = s.name.removeprefix("specserve:").removesuffix("_total")
            if name in ("spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens", "n_decode",
                        "tokens_predicted"):
                out[name] = s.value
    return out


def _error_key(status: int, body: bytes) -> str:
    """'400 context_length_exceeded': errors grouped by status and OpenAI error code."""
    try:
        err = json.loads(body)["error"]
        return f"{status} {err.get('code') or err.get('type')}"
    except (ValueError, KeyError, TypeError):
        return f"{status} {body[:80]!r}"


def _one(client: httpx.Client, body: dict, kind: str, rng: random.Random, tally: Tally, lock: threading.Lock):
    t0 = time.perf_counter()
    try:
        if kind == "plain":
            r = client.post("/v1/chat/completions", json=body)
            if r.status_code != 200:
                raise RuntimeError(_error_key(r.status_code, r.content))
            tokens, ttft = r.json()["usage"]["completion_tokens"], None
        else:
            tokens, ttft, stop_after = 0, None, rng.randint(1, 5) if kind == "cancel" else None
            with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
                if r.status_code != 200:
                    raise RuntimeError(_error_key(r.status_code, r.read()))
                n = 0
                for line in r.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    ev = json.loads(line[6:])
                    if "error" in ev:  # after the headers an error is an event (drain deadline, replica failed)
                        raise RuntimeError(f"stream error: {ev['error'].get('code') or ev['error'].get('type')}")
                    if ev.get("usage") and not ev.get("choices"):
                        tokens = ev["usage"]["completion_tokens"]
                    elif ev.get("choices") and ev["choices"][0]["delta"].get("content"):
                        ttft = ttft if ttft is not None else time.perf_counter() - t0
                        n += 1
                        if stop_after is not None and n >= stop_after:
                            break  # leaving the block drops the connection mid-stream
            if kind == "cancel":
                with lock:
                    tally.cancels += 1
                return
    except Exception as e:  # noqa: BLE001 - every failure is counted, none stops the test
        key = str(e)[:160] or type(e).__name__
        with lock:
            tally.errors[key] = tally.errors.get(key, 0) + 1
        return
    latency = time.perf_counter() - t0
    with lock:
        tally.latencies.append(latency)
        tally.tokens += tokens
        if ttft is not None:
            tally.ttfts.append(ttft)
            if tokens > 1:
                tally.tpots.append((latency - ttft) / (tokens - 1))
        elif tokens:
            tally.tpots.append(latency / tokens)


def _pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return round(v[min(len(v) - 1, int(q * len(v)))], 4) if v else 0.0


def run(args, clients: int | None = None) -> dict:
    """One load level: `clients` (default args.clients) clients for args.duration seconds."""
    clients = clients if clients is not None else args.clients
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    prompts = load_workload(args.prompts or args.workload, 100_000)
    rss_before, spec_before = _rss(args.url, args.pid, headers), _spec_totals(args.url, headers)
    tally, lock = Tally(), threading.Lock()
    deadline = time.perf_counter() + args.duration

    def client_loop(seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=args.url, headers=headers, timeout=args.timeout) as client:
            while time.perf_counter() < deadline:
                p = rng.choice(prompts)
                body = {"messages": list(p.messages), "max_tokens": args.max_tokens, "temperature": args.temperature,
                        "stream_options": {"include_usage": True}}
                if args.ignore_eos:
                    body["ignore_eos"] = True
                if args.model:
                    body["model"] = args.model
                u = rng.random()
                kind = "cancel" if u < args.cancel_share else "stream" if u < args.cancel_share + args.stream_share \
                    else "plain"
                _one(client, body, kind, rng, tally, lock)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client_loop, args=(args.seed + i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    spec_after = _spec_totals(args.url, headers)
    spec = {k: spec_after.get(k, 0) - spec_before.get(k, 0) for k in spec_after}
    drafted, passes = spec.get("spec_decode_num_draft_tokens", 0), spec.get("n_decode", 0)
    lat = tally.latencies

    def pct(q: float) -> float:
        return round(_pct(lat, q), 3)

    return {
        "url": args.url, "clients": clients, "duration_s": round(elapsed, 2), "prompts": len(prompts),
        "completed": len(lat), "cancelled": tally.cancels, "errors": sum(tally.errors.values()),
        "error_kinds": tally.errors, "requests_per_s": round(len(lat) / elapsed, 3),
        "latency_p50_s": pct(0.5), "latency_p95_s": pct(0.95),
        "ttft_p50_s": round(statistics.median(tally.ttfts), 3) if tally.ttfts else 0.0,
        "tokens_per_s": round(tally.tokens / elapsed, 2),
        "tpot_p50_s": _pct(tally.tpots, 0.5), "tpot_p95_s": _pct(tally.tpots, 0.95),
        "acceptance": round(spec["spec_decode_num_accepted_tokens"] / drafted, 4) if drafted else 0.0,
        "server_tokens_per_pass": round(spec["tokens_predicted"] / passes, 3) if passes else 0.0,
        "rss_before_mib": round(rss_before / 2**20, 1),
        "rss_after_mib": round(_rss(args.url, args.pid, headers) / 2**20, 1),
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m specserve.measure.loadtest", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--clients", default="8", help="concurrent clients, or levels run in turn: 1,2,4 (default 8)")
    p.add_argument("--duration", type=float, default=60, help="seconds (default 60)")
    p.add_argument("--workload", default="spec_bench", help="a built-in workload name or a JSONL file")
    p.add_argument("--prompts", metavar="FILE", help="JSONL prompts ({prompt} or {messages}); overrides --workload")
    p.add_argument("--model", help="model or profile name to request (default: the served model)")
    p.add_argument("--api-key")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--ignore-eos", action="store_true", help="every request generates --max-tokens tokens")
    p.add_argument("--stream-share", type=float, default=0.4, help="share of streamed requests (default 0.4)")
    p.add_argument("--cancel-share", type=float, default=0.1, help="share of streams abandoned early (default 0.1)")
    p.add_argument("--pid", type=int, help="the server's process id, for its RSS from /proc")
    p.add_argument("--timeout", type=float, default=300, help="per-request timeout in seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="OUT", help="also write the report as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        levels = [int(c) for c in str(args.clients).split(",")]
    except ValueError:
        levels = [0]
    if min(levels) < 1 or args.duration <= 0 or not 0 <= args.cancel_share + args.stream_share <= 1:
        print("loadtest: need --clients >= 1, --duration > 0, stream + cancel shares within [0, 1]", file=sys.stderr)
        return 2
    reports = []
    try:
        for n in levels:
            reports.append(run(args, n))
            for key, value in reports[-1].items():
                print(f"{key:>24}: {value}")
            print()
    except (ValueError, OSError, httpx.HTTPError) as e:
        print(f"loadtest: {e}", file=sys.stderr)
        return 1
    if args.json:
        out = reports[0] if len(reports) == 1 else {"levels": reports}
        Path(args.json).write_text(json.dumps({**out, "args": vars(args)}, indent=2) + "\n")
    return 0 if all(r["errors"] == 0 for r in reports) else 3


if __name__ == "__main__":
    sys.exit(main())
