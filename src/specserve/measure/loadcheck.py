"""The replicated endpoint against one server: same greedy text, then load (and optionally a fault).

    python -m specserve.measure.loadcheck --pair smollm2 --replicas 2 --clients 8 --duration 60
    python -m specserve.measure.loadcheck --pair smollm2 --replicas 2 --kill-after 20   # the fault test

1. Starts `specserve serve` (one server) and collects greedy answers to --prompts prompts; stops it.
2. Starts `specserve serve --replicas N` and asks the same prompts: the texts must be equal.
3. Runs `measure.loadtest` against it (mixed plain, streamed and abandoned chat requests).
   With --kill-after S, SIGKILLs one replica's process S seconds into the load; then the only
   errors allowed are streams that were running on it ("stream error: replica_failed"), at
   most its slots + queue, and the endpoint must report both replicas again before the end.
Prints one JSON report; exits 0 when every check passed, 3 otherwise.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import httpx

from ..bench.workloads import load_workload
from . import loadtest

READY_TIMEOUT_S = 600.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(serve_args: list[str], log_path: str, replicas: int | None) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cmd = [sys.executable, "-m", "specserve", "serve", *serve_args, "--port", str(port)]
    if replicas:
        cmd += ["--replicas", str(replicas)]
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}; see {log_path}")
        try:
            h = httpx.get(url + "/health", timeout=10).json()
            if h.get("status") == "ok" and h.get("replicas_reporting", replicas) == replicas:
                return proc, url
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(1)
    _stop(proc)
    raise RuntimeError(f"not ready after {READY_TIMEOUT_S} s; see {log_path}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _answers(url: str, prompts, max_tokens: int) -> list[str]:
    with httpx.Client(base_url=url, timeout=600) as c:
        out = []
        for p in prompts:
            r = c.post("/v1/chat/completions", json={"messages": list(p.messages), "max_tokens": max_tokens,
                                                     "temperature": 0})
            r.raise_for_status()
            out.append(r.json()["choices"][0]["message"]["content"])
        return out


def _kill_one(url: str, after: float, record: dict) -> None:
    time.sleep(after)
    victim = httpx.get(url + "/health", timeout=30).json()["replicas"][0]
    record.update(victim=victim["replica"], pid=victim["pid"], in_flight=victim["requests_active"])
    os.kill(victim["pid"], signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specserve.measure.loadcheck", description=__doc__.split("\n\n")[0])
    p.add_argument("--pair", default="smollm2", help="packaged pair to serve (default smollm2)")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="-t per replica, and for the single server (default 1)")
    p.add_argument("--slots", type=int, default=2, help="-np per replica, and for the single server (default 2)")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--duration", type=float, default=60)
    p.add_argument("--prompts", type=int, default=6, help="greedy prompts compared with the single server")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--kill-after", type=float, default=None, metavar="S",
                   help="SIGKILL one replica S seconds into the load (the fault test)")
    p.add_argument("--logs", default=None, metavar="DIR",
                   help="folder for the servers' logs (default: a new temporary folder, named in the report)")
    p.add_argument("--json", metavar="OUT", help="also write the report here")
    args = p.parse_args(argv)
    args.logs = args.logs or tempfile.mkdtemp(prefix="specserve-loadcheck-")
    serve_args = ["--pair", args.pair, "-t", str(args.threads), "-np", str(args.slots)]
    prompts = load_workload("spec-bench", args.prompts)
    report: dict = {"replicas": args.replicas, "clients": args.clients, "duration_s": args.duration,
                    "logs": args.logs}

    single, url = _start(serve_args, os.path.join(args.logs, "loadcheck-single.log"), None)
    try:
        expected = _answers(url, prompts, args.max_tokens)
    finally:
        _stop(single)
    cluster, url = _start(serve_args, os.path.join(args.logs, "loadcheck-replicas.log"), args.replicas)
    try:
        got = _answers(url, prompts, args.max_tokens)
        report["same_greedy_text"] = got == expected
        report["differing_prompts"] = [i for i, (a, b) in enumerate(zip(got, expected)) if a != b]
        kill: dict = {}
        killer = None
        if args.kill_after is not None:
            killer = threading.Thread(target=_kill_one, args=(url, args.kill_after, kill), daemon=True)
            killer.start()
        lt = loadtest.build_parser().parse_args(["--url", url, "--clients", str(args.clients), "--duration",
                                                 str(args.duration), "--max-tokens", str(args.max_tokens)])
        report["load"] = loadtest.run(lt, args.clients)
        if killer is not None:
            killer.join()
            report["kill"] = kill
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                h = httpx.get(url + "/health", timeout=30).json()
                if h["status"] == "ok" and h["replicas_reporting"] == args.replicas:
                    break
                time.sleep(1)
            report["recovered"] = h["status"] == "ok" and h["replicas_reporting"] == args.replicas
    finally:
        _stop(cluster)
    errors = report["load"]["error_kinds"]
    if args.kill_after is None:
        passed = report["same_greedy_text"] and report["load"]["errors"] == 0
    else:
        allowed = sum(n for k, n in errors.items() if k == "stream error: replica_failed")
        passed = (report["same_greedy_text"] and allowed == report["load"]["errors"]
                  and allowed <= args.slots + 16 and report["recovered"])
    report["passed"] = passed
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if passed else 3


if __name__ == "__main__":
    sys.exit(main())
