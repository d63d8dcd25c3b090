"""pytest plugin for running llama.cpp's server tests (tools/server/tests) offline against the shim.

Loaded with `-p peer_plugin`, with this folder and the upstream tests folder on PYTHONPATH (run.py
does both).  It changes nothing in the upstream files; at start-up it:

  * makes ServerPreset.load_all() (the session fixture that downloads every preset's model from
    HuggingFace) a no-op: the shim maps the presets to local files;
  * makes utils.download_file() return a placeholder path named after the URL's file, without
    downloading (test_speculative's draft model): the shim maps it by name;
  * gives ServerProcess.start() a floor on its start-up timeout ($PEER_START_TIMEOUT, default 120 s:
    the machine is shared) and turns a server that exits 77 (the shim: preset not covered) into a
    skip;
  * waits between tests while the file $PEER_PAUSE_WHILE exists (a CPU lock);
  * writes one JSON line per test to $PEER_RESULTS (nodeid, outcome, first line of the failure,
    duration) and, for failures and errors, the test's captured output to $PEER_RESULTS.d/.
"""
from __future__ import annotations

import json
import os
import re
import time

import pytest

import utils  # the upstream tests' utils.py (its folder is on PYTHONPATH)

SKIP_CODE = 77


def _no_load_all() -> None:
    return None


utils.ServerPreset.load_all = staticmethod(_no_load_all)


def _no_download(url: str, output_file_path: str | None = None) -> str:
    return output_file_path or os.path.join("peer-not-downloaded", url.split("/")[-1])


utils.download_file = _no_download

_orig_start = utils.ServerProcess.start


def _start(self, timeout_seconds: int = utils.DEFAULT_HTTP_TIMEOUT) -> None:
    floor = float(os.environ.get("PEER_START_TIMEOUT", "120"))
    try:
        return _orig_start(self, max(timeout_seconds, floor))
    except RuntimeError as e:
        if f"return code {SKIP_CODE}" in str(e):
            reason = "preset not covered"
            d = os.environ.get("PEER_LOG_DIR")
            if d and os.path.exists(os.path.join(d, "skip-reason.txt")):
                with open(os.path.join(d, "skip-reason.txt")) as f:
                    reason = f.read().strip()
            self.stop()
            pytest.skip(f"peer-shim: {reason}")
        raise


utils.ServerProcess.start = _start

_state: dict[str, dict] = {}


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Between tests (no server running), wait while $PEER_PAUSE_WHILE exists; outermost, so that
    pytest-timeout's clock has not started."""
    pause = os.environ.get("PEER_PAUSE_WHILE")
    if pause and os.path.exists(pause):
        print(f"\npeer-plugin: {pause} exists: pausing before {item.nodeid}", flush=True)
        while os.path.exists(pause):
            time.sleep(60)
    yield


def _first_line(report) -> str:
    lr = report.longrepr
    if lr is None:
        return ""
    if isinstance(lr, tuple):  # a skip: (file, line, reason)
        return str(lr[2]).splitlines()[0] if lr[2] else ""
    crash = getattr(lr, "reprcrash", None)
    if crash is not None and crash.message:
        return crash.message.strip().splitlines()[0][:400]
    return str(lr).strip().splitlines()[-1][:400]


def _trim(text: str, keep: int = 12000) -> str:
    if len(text) <= 2 * keep:
        return text
    return text[:keep] + f"\n\n[... {len(text) - 2 * keep} characters cut ...]\n\n" + text[-keep:]


def pytest_runtest_logreport(report) -> None:
    st = _state.setdefault(report.nodeid, {"outcome": "passed", "message": "", "duration": 0.0, "out": ""})
    st["duration"] += report.duration
    if report.when == "call":
        if report.passed:
            st["outcome"] = "passed"
        elif report.skipped:
            st["outcome"] = "skipped"
            st["message"] = _first_line(report)
        else:
            st["outcome"] = "failed"
            st["message"] = _first_line(report)
    elif report.failed:  # setup or teardown
        if st["outcome"] != "failed":
            st["outcome"] = "error"
            st["message"] = f"{report.when}: {_first_line(report)}"
    elif report.skipped and report.when == "setup":
        st["outcome"] = "skipped"
        st["message"] = _first_line(report)
    if report.failed:
        text = []
        for name, content in report.sections:
            text.append(f"----- {name} -----\n{content}")
        text.append(f"----- failure ({report.when}) -----\n{report.longreprtext}")
        st["out"] += "\n".join(text) + "\n"


def pytest_runtest_logfinish(nodeid, location) -> None:
    path = os.environ.get("PEER_RESULTS")
    st = _state.pop(nodeid, None)
    if not path or st is None:
        return
    entry = {"nodeid": nodeid, "outcome": st["outcome"], "message": st["message"],
             "duration": round(st["duration"], 2), "time": round(time.time(), 1),
             "target": os.environ.get("PEER_TARGET", "")}
    with open(path, "a") as f:
        f.write(json.dumps(entry) + "\n")
    if st["out"] and st["outcome"] in ("failed", "error"):
        d = path + ".d"
        os.makedirs(d, exist_ok=True)
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", nodeid)[:180]
        with open(os.path.join(d, name + ".txt"), "w") as f:
            f.write(_trim(st["out"]))
