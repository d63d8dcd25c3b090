"""Prompt and verification-pass speed against the micro-batch (-ub, -ubd): what docs/models.md's table measured.

    python -m specserve.measure.ubatch_speed qwen2.5-coder-1.5b-f16 -t 1 --ubatches 32,64,128,256,512 --reps 2

For each micro-batch, a fresh context of 2048 cells: a prompt of --prompt tokens (this file's text), then
passes of each --passes size with logits for every row (a verification), each cut back off the cache. The
settings run interleaved (A B C, C B A, ...); every time is taken on the wall clock and in CPU seconds of
this process, which other processes' load disturbs far less on a shared machine. One JSON line a run.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from .. import models
from ..backends import load_model


def _timed(fn) -> tuple[float, float]:
    t, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t, time.process_time() - c


def run_one(model, prompt: list[int], n_ubatch: int, passes: list[int], pass_reps: int, rng) -> dict:
    ctx = model.new_context(2048, n_ubatch=n_ubatch)
    try:
        wall, cpu = _timed(lambda: ctx.eval(prompt, "last"))
        row = {"ubatch": n_ubatch, "compute_mib": round(ctx.compute_bytes / 2**20, 2),
               "prompt_tok_s": len(prompt) / wall, "prompt_tok_per_cpu_s": len(prompt) / cpu}
        for n in passes:
            times = []
            for _ in range(pass_reps):
                tokens = [int(x) for x in rng.integers(100, 5000, n)]
                times.append(_timed(lambda: ctx.eval(tokens, "all")))
                ctx.truncate(len(prompt))
            row[f"pass{n}_ms"] = 1000 * statistics.median(w for w, _ in times)
            row[f"pass{n}_cpu_ms"] = 1000 * statistics.median(c for _, c in times)
        return row
    finally:
        ctx.close()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model", help="a GGUF path or packaged model name")
    p.add_argument("--ubatches", default="16,32,64,128,256,512", help="micro-batches to compare, comma-separated")
    p.add_argument("--prompt", type=int, default=512, help="prompt tokens (default 512)")
    p.add_argument("--passes", default="9,33", help="verification pass sizes (default 9,33)")
    p.add_argument("--pass-reps", type=int, default=2, help="passes of each size, the median kept")
    p.add_argument("--reps", type=int, default=2, help="rounds over all micro-batches")
    p.add_argument("-t", "--threads", type=int, default=None)
    p.add_argument("--json", help="write every run here")
    a = p.parse_args(argv)
    model = load_model(str(models.resolve(a.model)), n_threads=a.threads)
    prompt = model.tokenize(open(__file__).read() * 20)[:a.prompt]
    ubatches, passes = [int(x) for x in a.ubatches.split(",")], [int(x) for x in a.passes.split(",")]
    rng, rows = np.random.default_rng(0), []
    for rep in range(a.reps):
        for n_ubatch in ubatches if rep % 2 == 0 else ubatches[::-1]:
            row = {"rep": rep, **run_one(model, prompt, n_ubatch, passes, a.pass_reps, rng)}
            rows.append(row)
            print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    model.close()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "threads": a.threads, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
