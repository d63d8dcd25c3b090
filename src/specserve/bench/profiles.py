"""`specserve bench --auto-profile-from`: the bench's own servers start `--spec auto` from a given profile.

A saved auto profile (learned.py) is found by a key over the models, the thread count and the machine; a
profile learnt elsewhere (another pair, another thread count, a copy kept from a busy first run, one of
issue 60's profile matrix) would never be loaded as it is. So the bench writes the given profile's learnt
state under the key the server will look for, in a directory of its own, and starts its servers with
SPECSERVE_HOME pointing beside it: they load that state, learn on top of it, and save into the throwaway
directory, so the user's own profile is neither read nor changed. `empty` starts from no profile at all
(learning within the run, as a new machine's first server does).
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

EMPTY = "empty"


class ProfileHome:
    """A directory whose `auto/` holds one profile state per served engine; `env` points a server at it."""

    def __init__(self, source: str, target_path: str, draft_paths: list[str | None], n_threads: int):
        """source: EMPTY, or a profile file as learned.ProfileStore writes it (its `state` is what is kept)."""
        from .. import learned

        state = None if source == EMPTY else read_state(source)
        self._dir = tempfile.TemporaryDirectory(prefix="specserve-bench-profile-")
        self.home = Path(self._dir.name) / "models"  # learned.profile_dir() is SPECSERVE_HOME/../auto
        self.home.mkdir()
        self.paths = []
        for draft in draft_paths:
            store = learned.ProfileStore.for_models(target_path, draft, n_threads, Path(self._dir.name) / "auto")
            if state is not None:
                store.save(state, requests=0)
            self.paths.append(store.path)

    @property
    def env(self) -> dict[str, str]:
        return {"SPECSERVE_HOME": str(self.home), "SPECSERVE_AUTO_PROFILE": "1"}

    def close(self) -> None:
        self._dir.cleanup()


def read_state(path: str | os.PathLike) -> dict:
    """The controller state a profile file holds; ValueError if it holds none."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"--auto-profile-from {path}: cannot read it ({e})") from None
    state = data.get("state") if isinstance(data, dict) else None
    if not isinstance(state, dict):
        raise ValueError(f"--auto-profile-from {path}: not an auto profile (no \"state\" object)")
    return state
