#!/usr/bin/env python3
"""Run llama.cpp's own server tests against the real llama-server and against `specserve serve`.

    python3 compat/llama_server_tests/run.py --tests LLAMA_CPP/tools/server/tests --out OUT \
        --llama-server PATH/llama-server [--python VENV/bin/python] [--files test_basic,test_completion]

For each target and each chosen upstream test file it runs pytest in the tests folder with
LLAMA_SERVER_BIN_PATH pointing at shim.py (beside this file), one file at a time, and
writes OUT/results.json and OUT/results.md: per-file counts, a per-test table for both targets
(pass/fail/skip/error with the first line of each failure), the tests that pass on llama-server and
fail on specserve, and the flags the shim dropped for specserve.  See README.md.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHIM = HERE / "shim.py"
REPO_SRC = HERE.parents[1] / "src"  # this checkout's specserve, which the default --specserve runs

DEFAULT_FILES = [
    "test_basic", "test_completion", "test_chat_completion", "test_stream", "test_infill", "test_speculative",
    "test_tokenize", "test_template", "test_tool_call", "test_security", "test_metrics", "test_ctx_shift",
    "test_compat_oai_responses", "test_compat_anthropic", "test_ignore_eos", "test_kv_keep_only_active",
    "test_sleep", "test_slot_save", "test_compat_gcp",
]
TARGETS = ("llama-server", "specserve")
TIMEOUTISH = ("Timeout", "timed out", "did not start", "ConnectionError", "Connection refused",
              "RemoteDisconnected", "ReadTimeout")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_while(path: str | None, log) -> None:
    if not path:
        return
    waited = False
    while os.path.exists(path):
        if not waited:
            log(f"pause: {path} exists; polling every 60 s")
            waited = True
        time.sleep(60)
    if waited:
        log("pause over")


def specserve_env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO_SRC)}


def model_path(specserve: str, name: str) -> str:
    out = subprocess.run([*shlex.split(specserve), "models", "path", name], capture_output=True, text=True,
                         timeout=120, env=specserve_env())
    if out.returncode != 0:
        raise SystemExit(f"specserve models path {name}: {out.stderr.strip()}")
    return out.stdout.strip().splitlines()[-1]


def pytest_env(args, target: str, results: Path, shimlog: Path) -> dict:
    env = dict(os.environ)
    env.pop("SLOW_TESTS", None)
    env.pop("DEBUG", None)
    env.pop("DEBUG_EXTERNAL", None)
    env.update({
        "LLAMA_SERVER_BIN_PATH": str(SHIM),
        "PEER_TARGET": target,
        "PEER_LLAMA_SERVER": args.llama_server or "",
        "PEER_SPECSERVE": args.specserve or "",
        "PEER_SPECSERVE_PYTHONPATH": str(REPO_SRC),
        "PEER_MODEL_TEXT": args.model_text,
        "PEER_MODEL_DRAFT": args.model_draft,
        "PEER_MODEL_INFILL": args.model_infill,
        "PEER_THREADS": str(args.threads),
        "PEER_LOG_DIR": str(shimlog),
        "PEER_RESULTS": str(results),
        "PEER_START_TIMEOUT": str(args.start_timeout),
        "PEER_PAUSE_WHILE": args.pause_while or "",
        "PORT": str(args.port),
        "PYTHONPATH": os.pathsep.join([str(HERE), str(Path(args.tests).resolve())]),
        "LLAMA_CACHE": str(Path(args.out).resolve() / "llama-cache"),
        # specserve's --spec auto keeps what it learns beside its model cache: keep it in OUT, never in
        # the user's own cache (the models are passed by path)
        "SPECSERVE_HOME": str(Path(args.out).resolve() / "specserve-home" / "models"),
    })
    return env


_current: list[subprocess.Popen] = []


def kill_group(p: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=10)
            time.sleep(1)  # the servers in the group get a moment too
        except subprocess.TimeoutExpired:
            pass


def on_signal(signum, frame) -> None:
    for p in list(_current):
        kill_group(p)
    sys.exit(128 + signum)


def run_pytest(args, target: str, tests: list[str], results: Path, logfile: Path, log) -> int:
    shimlog = Path(args.out) / target / "shim"
    cmd = [args.python, "-m", "pytest", "-p", "peer_plugin", "-p", "no:cacheprovider", "-v", "-rN",
           "--timeout", str(args.test_timeout), "-m", args.markers, *tests]
    env = pytest_env(args, target, results, shimlog)
    t0 = time.time()
    with open(logfile, "a") as f:
        f.write(f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')} {target}: {' '.join(cmd)}\n")
        f.flush()
        # its own process group: pytest and the servers it started end together on a timeout or a signal
        p = subprocess.Popen(cmd, cwd=args.tests, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        _current.append(p)
        try:
            rc = p.wait(timeout=args.file_timeout)
        except subprocess.TimeoutExpired:
            kill_group(p)
            rc = -9
            f.write(f"\n===== killed after {args.file_timeout} s\n")
        finally:
            _current.remove(p)
    log(f"{target}: {' '.join(tests)[:120]} rc={rc} in {time.time() - t0:.0f} s")
    return rc


def load_results(path: Path) -> dict[str, dict]:
    out = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                e = json.loads(line)
                out[e["nodeid"]] = e
    return out


def short(outcome: str) -> str:
    names = {"passed": "pass", "failed": "FAIL", "skipped": "skip", "error": "ERROR", "missing": "-"}
    return names.get(outcome, outcome)


def md_cell(text: str, n: int = 160) -> str:
    text = (text or "").replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= n else text[: n - 3] + "..."


def report(args) -> None:
    out = Path(args.out)
    data = {"meta": {}, "files": {}, "tests": {}}
    meta_path = out / "meta.json"
    if meta_path.exists():
        data["meta"] = json.loads(meta_path.read_text())
    for target in TARGETS:
        tdir = out / target
        if not tdir.exists():
            continue
        for res in sorted(tdir.glob("*.jsonl")):
            fname = res.stem
            main = load_results(res)
            rerun = load_results(tdir / "rerun" / res.name) if (tdir / "rerun" / res.name).exists() else {}
            for nodeid, e in main.items():
                t = data["tests"].setdefault(nodeid, {"file": fname})
                entry = {"outcome": e["outcome"], "message": e["message"], "duration": e["duration"]}
                if nodeid in rerun:
                    r = rerun[nodeid]
                    entry["first_run"] = {"outcome": e["outcome"], "message": e["message"]}
                    entry["outcome"], entry["message"] = r["outcome"], r["message"]
                    entry["rerun"] = True
                t[target] = entry
    files = collections.OrderedDict()
    for nodeid, t in sorted(data["tests"].items()):
        c = files.setdefault(t["file"], {tg: collections.Counter() for tg in TARGETS}
                             | {"both_pass": 0, "gap": 0, "ss_only": 0})
        for tg in TARGETS:
            c[tg][t.get(tg, {}).get("outcome", "missing")] += 1
        ls, ss = t.get("llama-server", {}).get("outcome"), t.get("specserve", {}).get("outcome")
        if ls == "passed" and ss == "passed":
            c["both_pass"] += 1
        elif ls == "passed" and ss in ("failed", "error"):
            c["gap"] += 1
        elif ss == "passed" and ls in ("failed", "error"):
            c["ss_only"] += 1
    data["files"] = {f: {tg: dict(c[tg]) for tg in TARGETS} | {"both_pass": c["both_pass"], "gap": c["gap"],
                                                              "specserve_only_pass": c["ss_only"]}
                     for f, c in files.items()}

    # dropped flags (specserve's shim log)
    dropped = collections.defaultdict(lambda: {"starts": 0, "tests": set(), "why": ""})
    translated = collections.Counter()
    inv = out / "specserve" / "shim" / "invocations.jsonl"
    if inv.exists():
        for line in inv.read_text().splitlines():
            e = json.loads(line)
            for d in e.get("dropped", []):
                key = d["flag"] + (f" {d['value']}" if d["flag"] in ("--spec-type", "--reasoning-format", "--reasoning",
                                                                      "-fa", "--chat-template") and d["value"] else "")
                dropped[key]["starts"] += 1
                dropped[key]["why"] = d["why"]
                dropped[key]["tests"].add(e.get("test", "").split(" ")[0])
            for t in e.get("translated", []):
                translated[t.split(" -> ")[0].split(" ")[0] + " -> " + t.split(" -> ")[1].split(" ")[0]] += 1
    data["dropped_flags"] = {k: {"starts": v["starts"], "tests": len(v["tests"]), "why": v["why"]}
                             for k, v in sorted(dropped.items(), key=lambda kv: -kv[1]["starts"])}
    data["translated_flags"] = dict(translated)

    tot = {tg: collections.Counter() for tg in TARGETS}
    for t in data["tests"].values():
        for tg in TARGETS:
            tot[tg][t.get(tg, {}).get("outcome", "missing")] += 1
    ls_pass = [n for n, t in data["tests"].items() if t.get("llama-server", {}).get("outcome") == "passed"]
    both = [n for n in ls_pass if data["tests"][n].get("specserve", {}).get("outcome") == "passed"]
    gap = [n for n in ls_pass if data["tests"][n].get("specserve", {}).get("outcome") in ("failed", "error")]
    gap_skip = [n for n in ls_pass if data["tests"][n].get("specserve", {}).get("outcome") == "skipped"]
    data["summary"] = {"tests": len(data["tests"]), "llama_server": dict(tot["llama-server"]),
                       "specserve": dict(tot["specserve"]), "pass_on_llama_server": len(ls_pass),
                       "of_those_pass_on_specserve": len(both), "gap": len(gap), "gap_skipped": len(gap_skip)}
    (out / "results.json").write_text(json.dumps(data, indent=1, default=list))

    L = ["# llama.cpp server tests: llama-server vs specserve", ""]
    m = data["meta"]
    if m:
        L += [f"- tests: {m.get('tests_source', '')}", f"- markers: `{m.get('markers', '')}`, per-test timeout "
              f"{m.get('test_timeout', '')} s", f"- started {m.get('started', '')}", ""]
    s = data["summary"]
    skipped = f", {s['gap_skipped']} are skipped there" if s['gap_skipped'] else ""
    L += [f"**{s['pass_on_llama_server']} tests pass on llama-server; of those {s['of_those_pass_on_specserve']} pass "
          f"on specserve, {s['gap']} fail or error there{skipped}.**", "",
          f"All {s['tests']} tests: llama-server {dict(tot['llama-server'])}; specserve {dict(tot['specserve'])}", "",
          "| file | llama-server pass / fail / error / skip | specserve pass / fail / error / skip | pass on both "
          "| pass on llama-server only | pass on specserve only |",
          "|---|---|---|---|---|---|"]
    for f, c in data["files"].items():
        def cnt(tg):
            x = c[tg]
            return f"{x.get('passed', 0)} / {x.get('failed', 0)} / {x.get('error', 0)} / {x.get('skipped', 0)}"
        L.append(f"| {f} | {cnt('llama-server')} | {cnt('specserve')} | {c['both_pass']} | {c['gap']} "
                 f"| {c['specserve_only_pass']} |")
    L += ["", "## Passes on llama-server, fails on specserve", "",
          "| test | specserve's first failure line |", "|---|---|"]
    for n in gap:
        L.append(f"| `{md_cell(n, 200)}` | {md_cell(data['tests'][n]['specserve']['message'], 220)} |")
    L += ["", "## Dropped flags (specserve)", "", "| flag | server starts | tests | why |", "|---|---|---|---|"]
    for k, v in data["dropped_flags"].items():
        L.append(f"| `{k}` | {v['starts']} | {v['tests']} | {v['why']} |")
    if translated:
        L += ["", "Translated: " + ", ".join(f"`{k}` ({v})" for k, v in translated.most_common())]
    L += ["", "## Every test", "",
          "| test | llama-server | specserve | first failure line (specserve, else llama-server) |",
          "|---|---|---|---|"]
    for n, t in sorted(data["tests"].items()):
        ls, ss = t.get("llama-server", {}), t.get("specserve", {})
        msg = ss.get("message") if ss.get("outcome") not in ("passed", None) else ls.get("message", "")
        flag = " (rerun)" if ss.get("rerun") else ""
        L.append(f"| `{md_cell(n, 200)}` | {short(ls.get('outcome', 'missing'))} "
                 f"| {short(ss.get('outcome', 'missing'))}{flag} | {md_cell(msg, 200)} |")
    (out / "results.md").write_text("\n".join(L) + "\n")
    print(json.dumps(data["summary"]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tests", required=True,
                    help="llama.cpp's tools/server/tests folder (with ../../../models/templates)")
    ap.add_argument("--out", required=True, help="results folder")
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--files", default=",".join(DEFAULT_FILES), help="upstream test files under unit/, without .py")
    ap.add_argument("-k", dest="keyword", default=None, help="pytest -k expression (a subset)")
    ap.add_argument("--llama-server", default=os.environ.get("LLAMA_SERVER"),
                    help="the real llama-server binary (default: $LLAMA_SERVER); its folder goes on LD_LIBRARY_PATH")
    ap.add_argument("--specserve", default=f"{sys.executable} -m specserve",
                    help="the command that runs specserve (default: this checkout's, `python -m specserve` with "
                         "src/ on PYTHONPATH); also used to find the packaged models")
    ap.add_argument("--model-text", help="GGUF for the text presets (default: specserve's smollm2-f16)")
    ap.add_argument("--model-draft", help="GGUF for the draft preset (default: smollm2-q4_1)")
    ap.add_argument("--model-infill", help="GGUF for the infill preset, with FIM tokens (default: qwen2.5-coder-0.5b)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--port", type=int, default=0, help="port the servers listen on (default: a free one)")
    ap.add_argument("--markers", default="not slow")
    ap.add_argument("--test-timeout", type=int, default=300, help="seconds one test may take (pytest-timeout)")
    ap.add_argument("--file-timeout", type=int, default=10800, help="seconds one file may take (pauses included)")
    ap.add_argument("--start-timeout", type=int, default=120, help="floor on a server's start-up timeout")
    ap.add_argument("--pause-while", default=None, help="before each test, wait while this file exists")
    ap.add_argument("--rerun", action="store_true",
                    help="then rerun once: on specserve the tests that passed on llama-server and failed there; "
                         "on llama-server the failures that look like timeouts")
    ap.add_argument("--rerun-only", action="store_true", help="only the reruns (after an earlier run)")
    ap.add_argument("--report-only", action="store_true", help="only rebuild results.json/results.md")
    ap.add_argument("--python", default=sys.executable, help="python with pytest, pytest-timeout and the "
                    "tests' requirements")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        report(args)
        return 0
    args.tests = str(Path(args.tests).resolve())
    if args.specserve:
        args.model_text = args.model_text or model_path(args.specserve, "smollm2-f16")
        args.model_draft = args.model_draft or model_path(args.specserve, "smollm2-q4_1")
        args.model_infill = args.model_infill or model_path(args.specserve, "qwen2.5-coder-0.5b")
    if not (args.model_text and args.model_draft and args.model_infill):
        raise SystemExit("give --specserve or all of --model-text/--model-draft/--model-infill")
    args.port = args.port or free_port()
    targets = [t for t in args.targets.split(",") if t]
    files = [f for f in args.files.split(",") if f]
    runlog = out / "run.log"

    def log(msg: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {msg}"
        print(line, flush=True)
        with open(runlog, "a") as f:
            f.write(line + "\n")

    meta = {"tests_source": args.tests, "markers": args.markers, "test_timeout": args.test_timeout,
            "started": time.strftime("%Y-%m-%d %H:%M:%S"), "files": files, "targets": targets,
            "models": {"text": Path(args.model_text).name, "draft": Path(args.model_draft).name,
                       "infill": Path(args.model_infill).name}}
    if not args.rerun_only:
        (out / "meta.json").write_text(json.dumps(meta, indent=1))
    for target in targets:
        if target not in TARGETS:
            raise SystemExit(f"unknown target {target}")
        if target == "llama-server" and not args.llama_server:
            raise SystemExit("--llama-server is needed")
        if target == "specserve" and not args.specserve:
            raise SystemExit("--specserve is needed")
    t_start = time.time()
    if not args.rerun_only:
        for target in targets:
            tdir = out / target
            tdir.mkdir(exist_ok=True)
            t0 = time.time()
            for f in files:
                wait_while(args.pause_while, log)
                results = tdir / f"{f}.jsonl"
                if results.exists():
                    results.unlink()
                shutil.rmtree(tdir / f"{f}.jsonl.d", ignore_errors=True)
                tests = [f"unit/{f}.py"] + (["-k", args.keyword] if args.keyword else [])
                run_pytest(args, target, tests, results, tdir / f"{f}.log", log)
            log(f"{target}: all files in {time.time() - t0:.0f} s")
            report(args)
    if args.rerun or args.rerun_only:
        report(args)
        data = json.loads((out / "results.json").read_text())
        for target in targets:
            todo = collections.defaultdict(list)
            for nodeid, t in data["tests"].items():
                mine = t.get(target, {})
                if mine.get("rerun"):
                    continue
                if target == "specserve":
                    want = (t.get("llama-server", {}).get("outcome") == "passed"
                            and mine.get("outcome") in ("failed", "error"))
                else:
                    want = (mine.get("outcome") in ("failed", "error")
                            and any(s in mine.get("message", "") for s in TIMEOUTISH))
                if want:
                    todo[t["file"]].append(nodeid)
            rdir = out / target / "rerun"
            rdir.mkdir(parents=True, exist_ok=True)
            for f, nodeids in todo.items():
                wait_while(args.pause_while, log)
                log(f"{target}: rerun {len(nodeids)} test(s) of {f}")
                results = rdir / f"{f}.jsonl"
                run_pytest(args, target, nodeids, results, rdir / f"{f}.log", log)
        report(args)
    log(f"done in {time.time() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
