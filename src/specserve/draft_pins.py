"""The draft `specserve bench --drafts auto` measured fastest for a target, kept for `-md auto`.

`-md auto` ranks drafts by what a pass costs (draft_choice.py); what it cannot know without running them
is how often each one's drafts are accepted. `bench --drafts auto` runs every pairable candidate end
to end on the user's prompts, and the fastest one (if it beats the target alone) is pinned here for
this target on this machine; `-md auto` then puts it first while its file is unchanged.

File: ``<profile_dir()>/draft-pins.json`` (learned.py: beside the auto profiles), one entry per target
file, machine and thread count::

    {"format": "specserve.draft-pins", "version": 1, "pins": {KEY: {
        "target": FILE, "draft": {"path": "...", **FILE}, "speedups": {"name": 1.8, ...},
        "pinned_at": "2026-12-07T13:00:00+00:00"}}}

FILE is learned.file_identity's: a draft replaced in place (another size, time or first MiB) unpins.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from datetime import datetime, timezone
from pathlib import Path

from . import learned

FORMAT, VERSION = "specserve.draft-pins", 1
log = logging.getLogger("specserve")


def pins_path() -> Path:
    return learned.profile_dir() / "draft-pins.json"


def _key(target: str, n_threads: int) -> str:
    inputs = {"target": learned.file_identity(target), "machine": learned.machine_identity(), "n_threads": n_threads}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:20]


def _read() -> dict:
    try:
        data = json.loads(pins_path().read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        log.warning("ignoring the unreadable draft pins %s (%s)", pins_path(), e)
        return {}
    ok = isinstance(data, dict) and (data.get("format"), data.get("version")) == (FORMAT, VERSION)
    return data.get("pins", {}) if ok and isinstance(data.get("pins"), dict) else {}


def pinned(target: str, n_threads: int) -> str | None:
    """The pinned draft's path for `target` here, where its file is the one measured; else None."""
    try:
        entry = _read().get(_key(target, n_threads))
        if not isinstance(entry, dict):
            return None
        draft = entry["draft"]
        path = draft["path"]
        if learned.file_identity(path) != {k: v for k, v in draft.items() if k != "path"}:
            return None
        return path
    except (OSError, KeyError, TypeError):
        return None


def pin(target: str, draft: str, n_threads: int, speedups: dict[str, float]) -> Path:
    """Pin `draft` for `target` (atomic write; OSError is the caller's to report)."""
    pins = _read()
    pins[_key(target, n_threads)] = {
        "target": learned.file_identity(target), "draft": {"path": os.path.abspath(draft),
                                                           **learned.file_identity(draft)},
        "speedups": speedups, "pinned_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    path = pins_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    try:
        tmp.write_text(json.dumps({"format": FORMAT, "version": VERSION, "pins": pins}, indent=1) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def winner(entries: list[dict], all_name: str) -> tuple[str | None, dict[str, float]]:
    """From a bench's summary entries: each draft model's speedup over the target alone (its entries over
    every prompt, averaged over temperatures and drafters), and the fastest one where it beats the target
    alone (None otherwise)."""
    by_draft: dict[str, list[float]] = {}
    for e in entries:
        if e.get("workload") == all_name and e.get("draft_model") and e.get("speedup"):
            by_draft.setdefault(e["draft_model"], []).append(float(e["speedup"]))
    speedups = {name: round(sum(v) / len(v), 4) for name, v in by_draft.items()}
    best = max(speedups, key=speedups.get, default=None)
    return (best if best is not None and speedups[best] > 1.0 else None), speedups
