"""How much a long prompt arriving slows the streams already running on a server.

    python -m specserve.server.interference --url http://127.0.0.1:8080 --streams 3 --prompt-tokens 2000

Starts --streams streaming requests (--max-tokens each, ignore_eos), waits --warmup seconds,
then sends one request whose prompt is about --prompt-tokens tokens long (max_tokens 1) and
waits for its answer. For each stream it compares the time per output token while the long
prompt was being processed (from sending it to its answer) with the time per output token
before it arrived. A server that runs prompts whole stalls every stream for the prompt's
length (the ratio is the prompt's seconds over a token's); one that chunks prompts between
decoding steps keeps it near the chunk's share of a step. The time per token just after the
prompt's answer (`after_vs_before`) tells the rest apart: what the prompt's cached cells and the
streams' own longer contexts cost every pass (attention over them), chunks or not. Works against
any OpenAI-compatible server that streams and honours ignore_eos (specserve, llama-server).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

import httpx

from ..bench.workloads import load_workload

_FILLER = "summarization"  # Spec-Bench's long texts make the long prompt: real prose, not one repeated line


def long_text(n_tokens: int) -> str:
    """About n_tokens tokens of prose (4 characters a token), from Spec-Bench's summarization texts."""
    texts = [" ".join(m["content"] for m in p.messages) for p in load_workload(_FILLER, 100)]
    out, i = [], 0
    while sum(len(t) for t in out) < 4 * n_tokens:
        out.append(texts[i % len(texts)])
        i += 1
    return "Summarize the following in one sentence.\n\n" + "\n\n".join(out)[:4 * n_tokens]


def _stream(client: httpx.Client, body: dict, times: list[float], done: threading.Event, errors: list) -> None:
    try:
        with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
            if r.status_code != 200:
                raise RuntimeError(f"{r.status_code} {r.read()[:200]!r}")
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    ev = json.loads(line[6:])
                    if ev.get("choices") and ev["choices"][0]["delta"].get("content"):
                        times.append(time.perf_counter())
    except Exception as e:  # noqa: BLE001 - reported, not raised: the other streams go on
        errors.append(str(e)[:200])
    finally:
        done.set()


def _tpot(times: list[float], start: float, end: float) -> float | None:
    """Mean seconds a token over [start, end], stalls included: from the last token at or before start
    to the first at or after end, over the gaps between them (None: the stream was not running throughout)."""
    first = max((i for i, t in enumerate(times) if t <= start), default=None)
    last = next((i for i, t in enumerate(times) if t >= end), None)
    if first is None or last is None or last == first:
        return None
    return (times[last] - times[first]) / (last - first)


def run(args) -> dict:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    base = {"max_tokens": args.max_tokens, "temperature": 0.0, "ignore_eos": True}
    if args.model:
        base["model"] = args.model
    errors: list[str] = []
    times: list[list[float]] = [[] for _ in range(args.streams)]
    dones = [threading.Event() for _ in range(args.streams)]
    with httpx.Client(base_url=args.url, headers=headers, timeout=args.timeout) as client:
        threads = []
        for i in range(args.streams):
            body = {**base, "messages": [{"role": "user", "content": f"Write a long story about a robot, part {i + 1}."}]}
            threads.append(threading.Thread(target=_stream, args=(client, body, times[i], dones[i], errors)))
        for t in threads:
            t.start()
        time.sleep(args.warmup)
        t_sent = time.perf_counter()
        r = client.post("/v1/chat/completions", json={**base, "max_tokens": 1,
                                                      "messages": [{"role": "user", "content": long_text(args.prompt_tokens)}]})
        t_answered = time.perf_counter()
        if r.status_code != 200:
            errors.append(f"long prompt: {r.status_code} {r.content[:200]!r}")
        prompt_tokens = r.json().get("usage", {}).get("prompt_tokens") if r.status_code == 200 else None
        for t in threads:
            t.join()
    streams = []
    for ts in times:
        before = _tpot(ts, t_sent - args.warmup / 2, t_sent - 1e-6)
        during = _tpot(ts, t_sent, t_answered)
        after = _tpot(ts, t_answered + 1e-6, t_answered + args.warmup / 2)  # None if the stream ended first
        streams.append({"tokens": len(ts), "tpot_before_s": before, "tpot_during_s": during, "tpot_after_s": after,
                        "slowdown": round(during / before, 2) if before and during else None,
                        "after_vs_before": round(after / before, 2) if before and after else None})
    slowdowns = [s["slowdown"] for s in streams if s["slowdown"]]
    return {"url": args.url, "streams": args.streams, "prompt_tokens": prompt_tokens,
            "prompt_seconds": round(t_answered - t_sent, 3), "streams_detail": streams,
            "slowdown_max": max(slowdowns) if slowdowns else None,
            "slowdown_median": statistics.median(slowdowns) if slowdowns else None, "errors": errors}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m specserve.server.interference", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--streams", type=int, default=3, help="streams running when the long prompt arrives (default 3)")
    p.add_argument("--prompt-tokens", type=int, default=2000, help="about how long the arriving prompt is (default 2000)")
    p.add_argument("--max-tokens", type=int, default=400, help="tokens each stream generates (default 400): "
                   "enough to outlast the long prompt")
    p.add_argument("--warmup", type=float, default=4.0, help="seconds the streams run before the prompt arrives")
    p.add_argument("--model", help="model or profile name to request")
    p.add_argument("--api-key")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--json", metavar="OUT", help="also write the report as JSON")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.streams < 1 or args.prompt_tokens < 1 or args.warmup <= 0:
        print("error: --streams and --prompt-tokens must be >= 1 and --warmup > 0", file=sys.stderr)
        return 2
    try:
        report = run(args)
    except httpx.HTTPError as e:
        print(f"error: {args.url}: {e}", file=sys.stderr)
        return 1
    for k, v in report.items():
        print(f"{k:>16}: {v}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
