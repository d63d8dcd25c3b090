#!/usr/bin/env python3
"""A stand-in for the `llama-server` binary that llama.cpp's server tests start.

llama.cpp's tools/server/tests/utils.py starts `$LLAMA_SERVER_BIN_PATH` with llama-server's
flags.  Point that variable at this script and it:

  * maps the model the tests ask for (--hf-repo/--hf-file, -hf, --model-url, -m, --model-draft:
    HuggingFace repos that cannot be downloaded here) to local GGUF files given by environment
    variables, or exits 77 (the plugin turns that into a skip) for presets this study does not
    cover (embedding, rerank, vision, LoRA, router, the big tool-call models);
  * then execs either the real llama-server ($PEER_TARGET=llama-server) with the same flags plus
    `--no-repack -t N -tb N -fa off`, or `specserve serve` ($PEER_TARGET=specserve) with the same
    flags: specserve takes llama-server's command line (cli/llama_flags.py). Two things change on
    the way: the thread count (forced for both), and `-c`, which is the context of all slots
    together in llama-server (each gets -c / -np, unless --kv-unified) and each slot's in specserve,
    so `-c C -np N` becomes `-c C/N`. Flags listed in DROPPED are left out and logged (none now:
    specserve takes every flag these tests pass, or refuses it with the reason).

Environment:
  PEER_TARGET          llama-server | specserve
  PEER_LLAMA_SERVER    path of the real llama-server binary (its folder goes on LD_LIBRARY_PATH)
  PEER_SPECSERVE       the command that runs specserve (default: this Python's `-m specserve`)
  PEER_SPECSERVE_PYTHONPATH  PYTHONPATH for it (run.py: this checkout's src/)
  PEER_MODEL_TEXT      GGUF for the text presets (tinyllama2 = stories260K, stories15M MoE, split)
  PEER_MODEL_DRAFT     GGUF for the draft preset (stories15M-q4_0)
  PEER_MODEL_INFILL    GGUF for the infill preset (stories260K-infill; needs FIM tokens)
  PEER_THREADS         threads (default 2)
  PEER_LOG_DIR         where invocations.jsonl (one line per start: the test, the flags, what was
                       dropped or translated) and skip-reason.txt are written
"""
from __future__ import annotations

import json
import os
import shlex
import sys
import time

SKIP = 77  # the plugin turns a server that exits with this into a pytest skip

# llama-server flags that take a value (the ones llama.cpp's test utils emit, and their short forms)
VALUE_FLAGS = {
    "--port", "--host", "--temp", "--seed", "-m", "--model", "-mu", "--model-url", "-md", "--model-draft",
    "-hf", "-hfr", "--hf-repo", "-hff", "--hf-file", "-hfd", "--hf-repo-draft", "--models-dir", "--models-max",
    "--models-preset", "--cors-origins", "-b", "--batch-size", "-ub", "--ubatch-size", "-t", "--threads",
    "-tb", "--threads-batch", "-ngl", "--n-gpu-layers", "--gpu-layers", "--pooling", "-a", "--alias",
    "--tags", "-c", "--ctx-size", "-np", "--parallel", "-ctk", "--cache-type-k", "-ctv", "--cache-type-v",
    "-fa", "--flash-attn", "-n", "--n-predict", "--slot-save-path", "-gan", "--grp-attn-n", "-gaw",
    "--grp-attn-w", "--lora", "--spec-type", "--api-key", "--api-key-file", "--spec-draft-n-max",
    "--spec-draft-n-min", "--draft-max", "--draft", "--draft-min", "--draft-p-min", "--spec-draft-p-min",
    "--spec-synth-len", "--spec-synth-rates", "--reasoning-format", "--reasoning", "--chat-template",
    "--chat-template-file", "--mmproj", "--mmproj-url", "--media-path", "--sleep-idle-seconds", "--cache-ram",
    "--cache-reuse", "--cache-reuse-hybrid", "--cache-reuse-hybrid-min-share", "--tools", "--tools-runtime",
    "--mcp-servers-config", "--mcp-servers-json", "--top-k", "--top-p", "--min-p", "-s", "--keep",
    "--n-keep", "-ngld", "--n-gpu-layers-draft", "-cd", "--ctx-size-draft", "--timeout", "-to",
    "--threads-http", "--chat-template-kwargs", "--reasoning-budget",
}

# llama-server flags not passed to specserve, and why (every other flag is passed on as given)
DROPPED: dict[str, str] = {}  # (none left: specserve takes every flag these tests pass, or refuses it with a reason)

# llama-server flags without a value
BOOL_FLAGS = {
    "--offline", "--cont-batching", "-cb", "--embedding", "--embeddings", "--reranking", "--rerank", "--metrics",
    "--kv-unified", "-kvu", "--swa-full", "--slots", "--verbose", "-v", "--context-shift", "--jinja",
    "--backend_sampling", "--ui-mcp-proxy", "--ignore-eos", "--webui",
}

# threads are forced for both targets (the machine has 2 cores and is shared)
THREAD_FLAGS = {"-t", "--threads", "-tb", "--threads-batch"}

MODEL_FLAGS = {"-m", "--model", "-mu", "--model-url", "-hf", "-hfr", "--hf-repo", "-hff", "--hf-file"}
DRAFT_FLAGS = {"-md", "--model-draft", "-hfd", "--hf-repo-draft"}
UNSUPPORTED_PRESET_FLAGS = {  # presets outside this study: the test is skipped on both targets
    "--embedding": "embedding preset", "--embeddings": "embedding preset", "--reranking": "rerank preset",
    "--rerank": "rerank preset", "--lora": "LoRA preset", "--mmproj": "vision preset",
    "--mmproj-url": "vision preset", "--models-dir": "router preset", "--models-preset": "router preset",
    "--tools": "built-in tools (router/MCP) preset", "--mcp-servers-config": "MCP preset",
    "--mcp-servers-json": "MCP preset", "--ui-mcp-proxy": "MCP proxy preset",
}


def log_dir() -> str | None:
    d = os.environ.get("PEER_LOG_DIR")
    if d:
        os.makedirs(d, exist_ok=True)
    return d


def record(entry: dict) -> None:
    d = log_dir()
    if not d:
        return
    entry = {"time": round(time.time(), 3), "test": os.environ.get("PYTEST_CURRENT_TEST", ""), **entry}
    with open(os.path.join(d, "invocations.jsonl"), "a") as f:
        f.write(json.dumps(entry) + "\n")


def skip(reason: str, argv: list[str]) -> None:
    print(f"peer-shim: SKIP: {reason}", file=sys.stderr, flush=True)
    d = log_dir()
    if d:
        with open(os.path.join(d, "skip-reason.txt"), "w") as f:
            f.write(reason)
    record({"target": os.environ.get("PEER_TARGET"), "argv": argv, "skipped": reason})
    sys.exit(SKIP)


def parse(argv: list[str]) -> list[tuple[str, str | None]]:
    """llama-server's argv as (flag, value or None), in order."""
    def is_value(word: str) -> bool:
        return not word.startswith("-") or word[1:].replace(".", "", 1).isdigit()

    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--") and "=" in a:
            flag, value = a.split("=", 1)
            out.append((flag, value))
            i += 1
        elif a in VALUE_FLAGS:
            out.append((a, argv[i + 1] if i + 1 < len(argv) else ""))
            i += 2
        elif a in BOOL_FLAGS or a.startswith("--no-"):
            out.append((a, None))
            i += 1
        elif a.startswith("-") and i + 1 < len(argv) and is_value(argv[i + 1]):
            out.append((a, argv[i + 1]))  # not in the tables: a value follows if the next word is one
            i += 2
        else:
            out.append((a, None))
            i += 1
    return out


def model_for(ident: str, draft: bool) -> tuple[str | None, str]:
    """The local GGUF for what the tests asked for, and why; (None, reason) when not covered."""
    low = ident.lower()
    if ident.endswith(".gguf") and os.path.isfile(ident):
        return ident, "a local file: unchanged"
    env = os.environ.get
    if draft:
        if "stories15m" in low or "stories260k" in low:
            return env("PEER_MODEL_DRAFT"), "draft preset (stories15M-q4_0) -> PEER_MODEL_DRAFT"
        return None, f"draft model {ident!r} not mapped"
    if "stories260k-infill" in low:
        return env("PEER_MODEL_INFILL"), "infill preset (stories260K-infill) -> PEER_MODEL_INFILL"
    if "stories260k" in low or "stories15m_moe" in low or "tinyllamas/split/stories15m" in low:
        return env("PEER_MODEL_TEXT"), "text preset -> PEER_MODEL_TEXT"
    return None, f"model {ident!r} not mapped (embedding/rerank/vision/big real-model preset)"


def main() -> None:
    argv = sys.argv[1:]
    target = os.environ.get("PEER_TARGET", "llama-server")
    threads = os.environ.get("PEER_THREADS", "2")
    pairs = parse(argv)
    flags = {f for f, _ in pairs}
    for f, why in UNSUPPORTED_PRESET_FLAGS.items():
        if f in flags:
            skip(why, argv)

    # the model and the draft
    repo = file = url = path = None
    draft_ident = None
    for f, v in pairs:
        if f in ("-hf", "-hfr", "--hf-repo"):
            repo = v
        elif f in ("-hff", "--hf-file"):
            file = v
        elif f in ("-mu", "--model-url"):
            url = v
        elif f in ("-m", "--model"):
            path = v
        elif f in DRAFT_FLAGS:
            draft_ident = v
    if path:
        ident = path
    elif url:
        ident = url
    elif repo:
        ident = repo + ("/" + file if file else "")
    else:
        skip("no model given (router preset)", argv)
    model, model_why = model_for(ident, draft=False)
    if not model:
        skip(model_why, argv)
    draft = None
    if draft_ident:
        draft, draft_why = model_for(draft_ident, draft=True)
        if not draft:
            skip(draft_why, argv)
    mapped = {"model": [ident, model_why]}
    if draft_ident:
        mapped["draft"] = [draft_ident, draft_why]

    if target == "llama-server":
        binary = os.environ["PEER_LLAMA_SERVER"]
        out = []
        for f, v in pairs:
            if f in MODEL_FLAGS or f in DRAFT_FLAGS or f in THREAD_FLAGS:
                continue
            out += [f] if v is None else [f, v]
        out += ["--model", model]
        if draft:
            out += ["--model-draft", draft]
        out += ["--no-repack", "-t", threads, "-tb", threads, "-fa", "off"]
        env = dict(os.environ)
        libdir = os.path.dirname(os.path.realpath(binary))
        env["LD_LIBRARY_PATH"] = libdir + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
        record({"target": target, "argv": argv, "exec": out, "mapped": mapped})
        os.execve(binary, [binary, *out], env)

    # specserve: llama-server's own command line, less what the shim maps (models, threads) and what
    # DROPPED lists; `specserve serve` takes llama-server's flags itself (cli/llama_flags.py)
    command = shlex.split(os.environ.get("PEER_SPECSERVE") or f"{sys.executable} -m specserve")
    out = ["serve", "-m", model] + (["-md", draft] if draft else [])
    dropped, translated = [], []
    ctx = slots = None
    unified = any(f in ("--kv-unified", "-kvu") for f, _ in pairs)
    for f, v in pairs:
        if f in MODEL_FLAGS or f in DRAFT_FLAGS or f in THREAD_FLAGS:
            continue
        if f in ("-c", "--ctx-size"):
            ctx = v
            continue
        if f in ("-np", "--parallel"):
            slots = v
        if f in DROPPED:
            dropped.append({"flag": f, "value": v, "why": DROPPED[f]})
            continue
        out += [f] if v is None else [f, v]
    if ctx is not None:
        # llama-server's -c is the context of all slots together (each gets -c / -np, unless
        # --kv-unified); specserve's -c is each slot's
        per_slot = int(ctx) if unified or not slots or int(ctx) == 0 else int(ctx) // int(slots)
        out += ["-c", str(per_slot)]
        if str(per_slot) != ctx:
            translated.append(f"-c {ctx} -np {slots} -> -c {per_slot} (specserve's -c is per slot)")
    out += ["-t", threads]
    env = dict(os.environ)
    if os.environ.get("PEER_SPECSERVE_PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PEER_SPECSERVE_PYTHONPATH"]
    else:
        env.pop("PYTHONPATH", None)  # the runner's (the plugin, the tests) is not specserve's
    record({"target": target, "argv": argv, "exec": command + out, "mapped": mapped, "dropped": dropped,
            "translated": translated})
    for d in dropped:
        print(f"peer-shim: dropped {d['flag']}{' ' + d['value'] if d['value'] is not None else ''}: {d['why']}",
              file=sys.stderr, flush=True)
    os.execvpe(command[0], command + out, env)


if __name__ == "__main__":
    main()
