"""What the router costs: the switch time (the first request to an unloaded model) and the decode rate
through the router against the single-model server on the same model.

    python -m specserve.measure.router_speed --model smollm2-f16 --rounds 5 --tokens 128

Starts `specserve serve -m MODEL` and `specserve serve --models-from packaged` (each with -t, --spec and
--no-cross-request as given, and no draft: the router's children with a preset's `model-draft = none`), on
free ports. Switch time: a 1-token request to the router while the model
is unloaded (its child starts, loads, answers), beside the single server's start to its first answer.
Then, both warm, rounds of: a 1-token request (latency) and a greedy streamed chat of --tokens tokens
(ignore_eos) to each, first of a pair alternating; the client counts tokens from its first chunk of text
to its last, so that the prompt (cached) stays out. Reports medians, the median paired ratio
router/direct, the servers' own decode rates (timings.predicted_per_second) and each path's client rate
over its server's: what delivery costs, apart from how fast the engine ran on a busy machine. JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str]) -> tuple[subprocess.Popen, str, float]:
    """The server, its URL, and the seconds it took to answer /health."""
    port = free_port()
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "specserve", "serve", *args, "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url, time.perf_counter() - t0
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"server {' '.join(args)} not ready in 120 s")


def chat(url: str, model: str, tokens: int) -> tuple[float, float, float]:
    """(seconds to the whole answer, client tokens per second from the first chunk of text to the last, the
    server's own decode rate: timings.predicted_per_second)."""
    body = {"model": model, "messages": PROMPT, "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    t0, first, last, n, server = time.perf_counter(), 0.0, 0.0, 0, float("nan")
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if any((c.get("delta") or {}).get("content") for c in event.get("choices") or []):
                now = time.perf_counter()
                first = first or now
                last = now
            if event.get("usage"):
                n = event["usage"]["completion_tokens"]
                server = (event.get("timings") or {}).get("predicted_per_second", server)
    return time.perf_counter() - t0, (n - 1) / (last - first) if last > first else float("nan"), server


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-f16", help="a packaged model (default smollm2-f16)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--threads", default="1")
    p.add_argument("--spec", default="none", help="--spec of both servers (default none: the decode alone)")
    a = p.parse_args()
    common = ["-t", a.threads, "--spec", a.spec, "--no-cross-request"]
    procs = []
    try:
        direct_proc, direct, direct_ready = start(["-m", a.model, *common])
        procs.append(direct_proc)
        direct_first = direct_ready + chat(direct, a.model, 1)[0]  # the single server, started and answering
        preset = tempfile.NamedTemporaryFile("w", suffix=".ini", delete=False)  # like for like: no draft either way
        preset.write("[*]\nmodel-draft = none\n")
        preset.close()
        router_proc, router, _ = start(["--models-from", "packaged", "--models-preset", preset.name, *common])
        procs.append(router_proc)
        cold = chat(router, a.model, 1)[0]
        for url in (direct, router):  # both warm: weights paged in, prompt cached
            chat(url, a.model, 8)
        warm: dict[str, list[float]] = {"direct": [], "router": []}
        rates: dict[str, list[float]] = {"direct": [], "router": []}
        served: dict[str, list[float]] = {"direct": [], "router": []}  # the server's own decode rate
        for i in range(a.rounds):
            order = [("direct", direct), ("router", router)][:: 1 if i % 2 == 0 else -1]
            for name, url in order:
                warm[name].append(chat(url, a.model, 1)[0])
                _, client, server = chat(url, a.model, a.tokens)
                rates[name].append(client)
                served[name].append(server)
        ratios = [r / d for r, d in zip(rates["router"], rates["direct"])]
        print(json.dumps({"model": a.model, "threads": a.threads, "spec": a.spec, "tokens": a.tokens,
                          "switch_s": round(cold, 3), "single_server_start_and_answer_s": round(direct_first, 3),
                          "loaded_1_token_s": {k: round(statistics.median(v), 4) for k, v in warm.items()},
                          "decode_tok_s": {k: round(statistics.median(v), 1) for k, v in rates.items()},
                          "decode_ratio_router_over_direct": round(statistics.median(ratios), 4),
                          "server_tok_s": {k: round(statistics.median(v), 1) for k, v in served.items()},
                          "client_over_server_rate": {
                              k: round(statistics.median([c / s for c, s in zip(rates[k], v)]), 4)
                              for k, v in served.items()},
                          "rates": {k: [round(x, 1) for x in v] for k, v in rates.items()}}, indent=1))
    finally:
        stop_all(procs)
    return 0


def stop_all(procs: list[subprocess.Popen]) -> None:
    """SIGTERM to each (they drain), then SIGKILL to any still running 30 s later."""
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
