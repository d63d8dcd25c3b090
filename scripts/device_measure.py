"""The device check's measurement (scripts/device_check.sh runs it): a GPU's pass costs, then the target
alone, `--spec auto` and llama-server's best mode on the same GGUFs, printed as one small table.

Steps (each prints as it goes; the table and a JSON of it end the run, the JSON in --out):
1. models: the carried pair (.devcarry/models/target.gguf, draft.gguf), else a synthetic pair written here
   (`models`: real GGUFs do not fit the 64 MiB a device call carries);
2. passes: the target's pass over n tokens after a 64-token context, n = 1..65 (median of 5, ms): the
   curve tests/auto/gpu_costs.py derives from published figures;
3. specserve generate, target alone and auto (an empty profile), 128 tokens greedy, tokens/s;
4. llama-server (when --server names a binary): target alone, draft-simple at 4/8/16, ngram-simple,
   ngram-mod; its best mode is the fastest of these.

--small writes a tiny pair and runs everything on the CPU: what scripts/device_check.sh --dry-run does here.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "def add(a, b):\n    return a + b\n\n" * 6 + "Rewrite add as sub:\n"
PASSES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17, 24, 32, 33, 48, 64, 65)
SERVER_MODES = {"target alone": [], "draft-simple 4": ["--spec-type", "draft-simple", "--draft-max", "4"],
                "draft-simple 8": ["--spec-type", "draft-simple", "--draft-max", "8"],
                "draft-simple 16": ["--spec-type", "draft-simple", "--draft-max", "16"],
                "ngram-simple": ["--spec-type", "ngram-simple"], "ngram-mod": ["--spec-type", "ngram-mod"]}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def models(work: Path, small: bool) -> tuple[Path, Path]:
    """(target, draft): the carried pair if there is one, else a synthetic pair written into `work`: a target
    of 24 layers (1.7B at width 2560, quantized to Q4_K_M as users run it) whose last 21 layers barely touch
    the residual stream, and as its draft the same seed's first 3 layers (Q8_0): a draft 8x cheaper a token
    that predicts nearly as the target does. Random weights: the text means nothing, the passes cost what a
    1.7B's cost."""
    carried = ROOT / ".devcarry" / "models"
    if (carried / "target.gguf").exists() and (carried / "draft.gguf").exists():
        return carried / "target.gguf", carried / "draft.gguf"
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_models import write_tiny_model

    import llama_cpp
    shape = (dict(n_embd=64, n_head=4, n_head_kv=2, n_ff=128) if small else
             dict(n_embd=2560, n_head=20, n_head_kv=4, n_ff=6912, n_ctx_train=4096))
    layers, draft_layers = (4, 1) if small else (24, 3)
    work.mkdir(parents=True, exist_ok=True)
    target, draft = work / "target.gguf", work / "draft.gguf"
    t0 = time.perf_counter()
    for path, n_layer, quiet, ftype in ((target, layers, layers - draft_layers, "Q4_K_M"),
                                        (draft, draft_layers, 0, "Q8_0")):
        f16 = work / "f16.gguf"
        write_tiny_model(f16, seed=1, f16=True, n_layer=n_layer, quiet_layers=quiet, **shape)
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
        params.nthread = os.cpu_count() or 1
        if llama_cpp.llama_model_quantize(str(f16).encode(), str(path).encode(), params) != 0:
            raise SystemExit(f"quantizing {path.name} to {ftype} failed")
        f16.unlink()
    log(f"synthetic pair written in {time.perf_counter() - t0:.0f} s: {target} "
        f"({target.stat().st_size >> 20} MiB), {draft} ({draft.stat().st_size >> 20} MiB)")
    return target, draft


def passes(target: Path, ngl: int, threads: int | None) -> dict[int, float]:
    """ms of the target's pass over n tokens after a 64-token context (median of 5, after a warm-up)."""
    import llama_cpp
    llm = llama_cpp.Llama(str(target), n_gpu_layers=ngl, n_ctx=512, n_batch=128, n_ubatch=128,
                          n_threads=threads, n_threads_batch=threads, logits_all=True, verbose=False)
    toks = llm.tokenize(PROMPT.encode() * 8)[:64 + max(PASSES)]
    llm.eval(toks[:64])
    out = {}
    for n in PASSES:
        times = []
        for rep in range(6):
            llm.n_tokens = 64
            t0 = time.perf_counter()
            llm.eval(toks[64:64 + n])
            if rep:  # the first is a warm-up
                times.append(time.perf_counter() - t0)
        out[n] = round(statistics.median(times) * 1000, 3)
    return out


def generate(target: Path, draft: Path, spec: str, ngl: int, n: int, threads: int | None) -> dict:
    cmd = [sys.executable, "-m", "specserve", "generate", "-m", str(target), "-md", str(draft), "--spec", spec,
           "-ngl", str(ngl), "-ngld", str(ngl), "-n", str(n), "--ignore-eos", "--no-auto-profile", "--json",
           "-p", PROMPT, *(["-t", str(threads)] if threads else [])]
    res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": _pythonpath()})
    if res.returncode:
        raise SystemExit(f"specserve generate --spec {spec} failed:\n{res.stderr[-3000:]}")
    stats = json.loads(res.stdout)["stats"]
    return {"tokens_per_s": stats["tokens_per_s"], "acceptance": stats["acceptance"],
            "drafters": stats.get("drafter_steps", {})}


def _pythonpath() -> str:
    return os.pathsep.join([str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])


def server(binary: str, target: Path, draft: Path, extra: list[str], ngl: int, n: int, port: int) -> float:
    """llama-server's tokens/s on one greedy completion of n tokens (after a warm-up request)."""
    cmd = [binary, "-m", str(target), "-ngl", str(ngl), "--port", str(port), "-np", "1", "-c", "4096",
           "--no-webui", *extra]
    if "draft-simple" in extra:
        cmd += ["-md", str(draft), "-ngld", str(ngl)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if urllib.request.urlopen(url + "/health", timeout=1).status == 200:
                    break
            except OSError:
                time.sleep(0.2)
            if proc.poll() is not None:
                raise SystemExit(f"llama-server {' '.join(extra)} exited:\n{proc.stderr.read()[-3000:]}")
        body = json.dumps({"prompt": PROMPT, "n_predict": n, "temperature": 0, "ignore_eos": True,
                           "cache_prompt": False}).encode()
        speeds = []
        for _ in range(2):  # a warm-up, then the one measured
            req = urllib.request.Request(url + "/completion", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=300) as r:
                speeds.append(json.load(r)["timings"]["predicted_per_second"])
        return round(speeds[-1], 2)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="a tiny pair on the CPU (the dry run)")
    ap.add_argument("--server", help="a llama-server binary (its best mode joins the table)")
    ap.add_argument("--work", default="/tmp/devcheck", help="where a synthetic pair is written")
    ap.add_argument("--out", help="a folder for result.json")
    ap.add_argument("-n", type=int, default=128)
    args = ap.parse_args(argv)
    import llama_cpp
    gpu = bool(llama_cpp.llama_supports_gpu_offload())
    log(f"llama-cpp-python {llama_cpp.__version__}, GPU offload: {gpu}")
    if not gpu and not args.small:
        raise SystemExit("this llama-cpp-python has no GPU offload: the CUDA build did not take")
    ngl = 99 if gpu else 0
    target, draft = models(Path(args.work), args.small)
    result = {"gpu_offload": gpu, "target": str(target), "draft": str(draft)}
    threads = 1 if args.small else None  # the tiny pair on a busy CPU: one thread, no waits at barriers
    result["passes_ms"] = passes(target, ngl, threads)
    log(f"passes (ms, n: t): {result['passes_ms']}")
    result["specserve"] = {spec: generate(target, draft, spec, ngl, args.n, threads) for spec in ("none", "auto")}
    log(f"specserve: {result['specserve']}")
    if args.server:
        result["llama_server"] = {mode: server(args.server, target, draft, extra, ngl, args.n, 8390 + i)
                                  for i, (mode, extra) in enumerate(SERVER_MODES.items())}
        log(f"llama-server: {result['llama_server']}")
    alone = result["specserve"]["none"]["tokens_per_s"]
    rows = [("specserve target alone", alone), ("specserve auto", result["specserve"]["auto"]["tokens_per_s"])]
    if args.server:
        best = max(result["llama_server"], key=result["llama_server"].get)
        rows += [("llama-server target alone", result["llama_server"]["target alone"]),
                 (f"llama-server best ({best})", result["llama_server"][best])]
    print("\n| run | tok/s | x specserve target alone |\n|---|---|---|")
    for name, tps in rows:
        print(f"| {name} | {tps:.1f} | {tps / alone:.2f}x |")
    one = result["passes_ms"][1]
    print("\npass over n tokens / over 1: " + ", ".join(f"{n}: {t / one:.2f}" for n, t in result["passes_ms"].items()))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "result.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
