"""How much a long prompt arriving slows the streams already running on a server.

    python -m specserve.measure.interference --url http://127.0.0.1:8080 --streams 3 --prompt-tokens 2000

Starts --streams streaming requests (--max-tokens each, ignore_eos), waits --warmup seconds,
then sends one request whose prompt is about --prompt-tokens tokens long (max_tokens 1) and
waits for its answer. For each stream it compares the time per output token while the long
prompt was being processed (from sending it to its answer) with the time per output token
before it arrived. A server that runs prompts whole stalls every stream for the prompt's
length (the ratio is the prompt's seconds over a token's); one that chunks prompts between
decoding steps keeps it near the chunk's share of a step. The time per token just after the
prompt's answer (`after_vs_before`) tells the rest apart: what the prompt's cached cells and the
streams' own longer contexts cost every pass (attention over them), chunks or not.

Streams may also slow down by themselves as they grow: with llama.cpp's unified KV cache a
token's attention spans every cell in use, so the streams' own growing contexts make every pass
dearer with no prompt at all. With --control (the default) the same streams first run
alone, before the measured run, and each stream's time per token over the same token positions as
the measured window is the control (`tpot_control_s`): `slowdown_vs_control` is what the prompt
itself costs the streams, `growth` what their own lengths cost. Run it on a freshly started server:
a prompt already cached in an idle slot would make the control slower too. Works against any
OpenAI-compatible server that streams and honours ignore_eos (specserve, llama-server).
"""
from __future__ import annotations

import argparse
import json
import secrets
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


def _stream(client: httpx.Client, body: dict, times: list[float], errors: list) -> None:
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


def span(times: list[float], start: float, end: float) -> tuple[int, int] | None:
    """The token positions around [start, end]: the last token at or before start and the first at or
    after end (None: the stream was not running throughout)."""
    first = max((i for i, t in enumerate(times) if t <= start), default=None)
    last = next((i for i, t in enumerate(times) if t >= end), None)
    if first is None or last is None or last == first:
        return None
    return first, last


def tpot(times: list[float], start: float, end: float) -> float | None:
    """Mean seconds a token over [start, end], stalls included: from the last token at or before start
    to the first at or after end, over the gaps between them (None: the stream was not running throughout)."""
    window = span(times, start, end)
    return tpot_between(times, window) if window else None


def tpot_between(times: list[float], window: tuple[int, int]) -> float | None:
    """Mean seconds a token between two token positions (None: the stream ended before the second).

    Tokens that arrived in one chunk (a speculative step's) share a time: where both positions
    fall in one chunk, the span starts at the chunk before instead, so it measures time at all."""
    first, last = window
    if last >= len(times):
        return None
    while first > 0 and times[first] >= times[last]:
        first -= 1
    return (times[last] - times[first]) / (last - first) if times[last] > times[first] else None


def _run_streams(client: httpx.Client, args, base: dict, errors: list[str], subject: str,
                 during=None) -> list[list[float]]:
    """Run the streams to their end; `during()`, if given, is called after --warmup seconds while they run.
    Returns each stream's token arrival times."""
    times: list[list[float]] = [[] for _ in range(args.streams)]
    threads = []
    for i in range(args.streams):
        body = {**base, "messages": [{"role": "user", "content": f"Write a long story about {subject}, part {i + 1}."}]}
        threads.append(threading.Thread(target=_stream, args=(client, body, times[i], errors)))
    for t in threads:
        t.start()
    if during is not None:
        time.sleep(args.warmup)
        during()
    for t in threads:
        t.join()
    return times


def run(args) -> dict:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    base = {**args.body, "max_tokens": args.max_tokens, "temperature": 0.0, "ignore_eos": True}
    if args.model:
        base["model"] = args.model
    errors: list[str] = []
    sent: dict = {}

    def long_prompt() -> None:
        sent["t"] = time.perf_counter()
        body = {**base, "max_tokens": 1, "messages": [{"role": "user", "content": long_text(args.prompt_tokens)}]}
        r = client.post("/v1/chat/completions", json=body)
        sent["answered"] = time.perf_counter()
        if r.status_code != 200:
            errors.append(f"long prompt: {r.status_code} {r.content[:200]!r}")
        sent["prompt_tokens"] = r.json().get("usage", {}).get("prompt_tokens") if r.status_code == 200 else None

    with httpx.Client(base_url=args.url, headers=headers, timeout=args.timeout) as client:
        # the control first (nothing cached yet), on another subject: a server that drafts from earlier
        # answers must not find the measured streams' text there, nor an earlier check's (the run's tag:
        # a check run twice found its whole answers in specserve's cross-request store, 450 tokens in 9 steps)
        tag = secrets.token_hex(3)
        control = _run_streams(client, args, base, errors, f"a lighthouse ({tag})") if args.control else None
        times = _run_streams(client, args, base, errors, f"a robot ({tag})", during=long_prompt)
    t_sent, t_answered = sent["t"], sent["answered"]
    streams = []
    for i, ts in enumerate(times):
        before = tpot(ts, t_sent - args.warmup / 2, t_sent - 1e-6)
        window = span(ts, t_sent, t_answered)
        during = tpot_between(ts, window) if window else None
        after = tpot(ts, t_answered + 1e-6, t_answered + args.warmup / 2)  # None if the stream ended first
        s = {"tokens": len(ts), "tpot_before_s": before, "tpot_during_s": during, "tpot_after_s": after,
             "slowdown": _ratio(during, before), "after_vs_before": _ratio(after, before)}
        if control is not None:
            ctl = tpot_between(control[i], window) if window else None
            s.update(tpot_control_s=ctl, slowdown_vs_control=_ratio(during, ctl), growth=_ratio(ctl, before))
        streams.append(s)
    report = {"url": args.url, "streams": args.streams, "prompt_tokens": sent["prompt_tokens"],
              "prompt_seconds": round(t_answered - t_sent, 3), "streams_detail": streams}
    keys = ["slowdown"] + (["slowdown_vs_control", "growth"] if control is not None else [])
    for key in keys:
        values = [s[key] for s in streams if s[key]]
        report[f"{key}_max"] = max(values) if values else None
        report[f"{key}_median"] = statistics.median(values) if values else None
    report["errors"] = errors
    return report


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m specserve.measure.interference", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--streams", type=int, default=3, help="streams running when the long prompt arrives (default 3)")
    p.add_argument("--prompt-tokens", type=int, default=2000,
                   help="about how long the arriving prompt is (default 2000)")
    p.add_argument("--max-tokens", type=int, default=400, help="tokens each stream generates (default 400): "
                   "enough to outlast the long prompt")
    p.add_argument("--warmup", type=float, default=4.0, help="seconds the streams run before the prompt arrives")
    p.add_argument("--control", action=argparse.BooleanOptionalAction, default=True,
                   help="first run the same streams alone, to tell what the prompt costs them from what their own "
                   "growing contexts do (default on; run on a freshly started server)")
    p.add_argument("--model", help="model or profile name to request")
    p.add_argument("--body", type=_json_object, default={}, metavar="JSON",
                   help="fields added to every request, a server's own options: e.g. specserve's "
                   "'{\"speculative\": {\"mode\": \"none\"}}' times the streams token by token (the "
                   "control is timed at the same chunk positions; speculative steps make chunks of several tokens)")
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
