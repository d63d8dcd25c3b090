"""What `--spec auto` has learnt, kept across processes.

A new process would otherwise plan its first requests from priors: it has not yet
measured what a target pass over n tokens costs on this machine, what the draft model
costs per token, or how often its drafts are accepted. So the controller's learnt state
is written to a small JSON file per (target file, draft file, threads, machine) and read
back when the same engine starts again: the first request of a new process plans like
the hundredth of the last one.

File: ``<cache>/auto/<key>.json``, where <cache> is ``$SPECSERVE_HOME/..`` or
``~/.cache/specserve`` and key is the first 20 hex digits of the sha256 of the inputs::

    {"format": "specserve.auto-profile", "version": 1,
     "inputs": {"target": FILE, "draft": FILE | null, "n_threads": 2,
                "machine": {"cpu": "...", "cores": 2, "arch": "x86_64", "llama_cpp": "0.3.36",
                            "extra_buffers": false}},
     "saved_at": "2026-12-01T10:00:00+00:00", "requests": 42,
     "state": {...}}   # Controller.state_dict()

    FILE = {"name": "x.gguf", "size": 3554...., "mtime_ns": ..., "head_sha256": sha256 of the first MiB}

A file whose format, version or inputs differ from the running engine's is ignored (a
model file replaced in place changes its size, mtime or first MiB). Writes are atomic.

What a profile claims is checked against the machine as it is now, since it may have been
learnt while other processes loaded it: loaded evidence counts half (pass costs at most 4
observations each, so this process's own passes take over within a few steps), and an
engine with a draft model times a few of its 1-token passes at start, alternating with the
target's, and rescales the saved drafting costs if the draft's cost relative to the target's is
off by more than 2x (`Controller.calibrate`; relative, so that a slow spell of the whole
machine rescales nothing). Why each of these rules exists, and what it fixed: docs/auto.md,
"What it keeps across processes". `--no-auto-profile` (or SPECSERVE_AUTO_PROFILE=0) turns all of it off.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

FORMAT, VERSION = "specserve.auto-profile", 1
SAVE_EVERY = 8  # requests between writes (and at engine close)
_HEAD = 1 << 20

log = logging.getLogger("specserve")


def profile_dir() -> Path:
    """Beside the model cache: $SPECSERVE_HOME/../auto, else ~/.cache/specserve/auto."""
    from .models import default_cache_dir

    return default_cache_dir().parent / "auto"


def enabled() -> bool:
    return os.environ.get("SPECSERVE_AUTO_PROFILE", "1") != "0"


def file_identity(path: str | os.PathLike) -> dict:
    """What tells one model file from another, cheaply: name, size, mtime and its first MiB's digest."""
    p = Path(path)
    st = p.stat()
    with open(p, "rb") as f:
        head = hashlib.sha256(f.read(_HEAD)).hexdigest()
    return {"name": p.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "head_sha256": head}


def machine_identity() -> dict:
    from .backends.llama_native import use_extra_buffers

    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        import llama_cpp

        version = llama_cpp.__version__
    except ImportError:  # pragma: no cover - the backend is a dependency
        version = "?"
    return {"cpu": cpu, "cores": os.cpu_count(), "arch": platform.machine(), "llama_cpp": version,
            "extra_buffers": use_extra_buffers()}


def inputs_for(target_path: str, draft_path: str | None, n_threads: int) -> dict:
    return {"target": file_identity(target_path), "draft": file_identity(draft_path) if draft_path else None,
            "n_threads": n_threads, "machine": machine_identity()}


class ProfileStore:
    """One engine's profile file: load once at start, save every SAVE_EVERY requests and at close."""

    def __init__(self, inputs: dict, directory: str | os.PathLike | None = None):
        self.inputs = inputs
        digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
        self.path = Path(directory) if directory else profile_dir()
        self.path = self.path / f"{digest[:20]}.json"
        self._requests_at_save = 0

    @classmethod
    def for_models(cls, target_path: str, draft_path: str | None, n_threads: int,
                   directory: str | os.PathLike | None = None) -> "ProfileStore":
        return cls(inputs_for(target_path, draft_path, n_threads), directory)

    def load(self) -> dict | None:
        """The saved controller state, or None (no file, or one for other inputs, or unreadable)."""
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("ignoring the unreadable auto profile %s (%s)", self.path, e)
            return None
        if not isinstance(data, dict) or (data.get("format"), data.get("version")) != (FORMAT, VERSION):
            log.info("ignoring auto profile %s: another format or version", self.path)
            return None
        if data.get("inputs") != self.inputs:
            log.info("ignoring auto profile %s: made for other models or another machine", self.path)
            return None
        state = data.get("state")
        return state if isinstance(state, dict) else None

    def due(self, requests: int) -> bool:
        return requests - self._requests_at_save >= SAVE_EVERY

    def save(self, state: dict, requests: int) -> None:
        """Write atomically; a failure is logged, never raised (the profile is an optimisation)."""
        self._requests_at_save = requests
        data = {"format": FORMAT, "version": VERSION, "inputs": self.inputs,
                "saved_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "requests": requests, "state": state}
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(data, indent=1) + "\n")
            os.replace(tmp, self.path)
        except OSError as e:
            log.warning("could not save the auto profile %s (%s)", self.path, e)
            tmp.unlink(missing_ok=True)
