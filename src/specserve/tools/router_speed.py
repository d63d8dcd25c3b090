"""What the router costs: the switch time (the first request to an unloaded model) and the decode rate
through the router against the single-model server on the same model.

    python -m specserve.tools.router_speed --model smollm2-f16 --rounds 5 --tokens 128

Starts `specserve serve -m MODEL` and `specserve serve --models-from packaged` (each with -t, --spec and
--no-cross-request as given), on free ports. Switch time: a 1-token request to the router while the model
is unloaded (its child starts, loads, answers), against the same request once loaded. Decode: greedy
streamed chats of --tokens tokens (ignore_eos), the two servers alternating, first of a pair alternating;
the client counts tokens from its first chunk of text to its last, so that the prompt (cached after the
first round) stays out. Reports medians and the median paired ratio router/direct, and, per path, the
client's rate over the server's own (timings.predicted_per_second): what delivery costs, apart from how
fast the engine ran on a busy machine. As JSON on stdout.
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
import time

import httpx

PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "specserve", "serve", *args, "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"server {' '.join(args)} not ready in 120 s")


def chat(url: str, model: str, tokens: int) -> tuple[float, float, float]:
    """(seconds to the whole answer, client tokens per second from the first chunk of text to the last, the
    server's own decode rate: timings.predicted_per_second)."""
    body = {"model": model, "messages": PROMPT, "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
            "stream": True}
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
        direct_proc, direct = start(["-m", a.model, *common])
        procs.append(direct_proc)
        router_proc, router = start(["--models-from", "packaged", *common])
        procs.append(router_proc)
        cold, _ = chat(router, a.model, 1)
        warm = {name: statistics.median(chat(url, a.model, 1)[0] for _ in range(5))
                for name, url in (("direct", direct), ("router", router))}
        rates: dict[str, list[float]] = {"direct": [], "router": []}
        delivered: dict[str, list[float]] = {"direct": [], "router": []}  # client rate / the server's own
        for i in range(a.rounds):
            order = [("direct", direct), ("router", router)][:: 1 if i % 2 == 0 else -1]
            for name, url in order:
                _, client, server = chat(url, a.model, a.tokens)
                rates[name].append(client)
                delivered[name].append(client / server)
        ratios = [r / d for r, d in zip(rates["router"], rates["direct"])]
        print(json.dumps({"model": a.model, "threads": a.threads, "spec": a.spec, "tokens": a.tokens,
                          "switch_s": round(cold, 3),
                          "loaded_1_token_s": {k: round(v, 4) for k, v in warm.items()},
                          "decode_tok_s": {k: round(statistics.median(v), 1) for k, v in rates.items()},
                          "decode_ratio_router_over_direct": round(statistics.median(ratios), 4),
                          "client_over_server_rate": {k: round(statistics.median(v), 4) for k, v in delivered.items()},
                          "rates": {k: [round(x, 1) for x in v] for k, v in rates.items()}}, indent=1))
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
