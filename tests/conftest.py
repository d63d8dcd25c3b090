"""Shared fixtures: tiny GGUF models the suite writes itself, and the packaged real models."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# What --spec auto learnt in one test must not steer another (or the user's next run):
# the suite keeps no auto profile; test_learned.py turns it on in a folder of its own.
os.environ["SPECSERVE_AUTO_PROFILE"] = "0"

# tests/ mirrors src/specserve (tests/server/, tests/auto/, ...; the top-level modules' tests here). Every
# folder imports the shared helpers by their bare names (`from server_fixtures import ...`, tiny_models,
# equality, lossless_checks): this folder is on sys.path for all of them. Helpers live in helper modules
# (names not starting with `test_`): a test module imports helpers, never another test module (held by
# tests/test_layers.py). The folders are not packages, so pytest imports each test file by its basename:
# basenames must be unique across the tree.
sys.path.insert(0, str(Path(__file__).parent))

from tiny_models import write_tiny_mamba, write_tiny_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_paths(tmp_path_factory) -> dict[str, Path]:
    """A tiny target and drafts of controlled similarity to it; padded variants (64 more tokens, the
    first rows of every weight unchanged, as Qwen2.5-7B's 152064 against 0.5B's 151936); a recurrent model."""
    d = tmp_path_factory.mktemp("tiny")
    return {
        "target": write_tiny_model(d / "target.gguf", seed=1),
        "draft_close": write_tiny_model(d / "draft_close.gguf", seed=1, noise=0.05, noise_seed=7),
        "draft_far": write_tiny_model(d / "draft_far.gguf", seed=2),
        "target_padded": write_tiny_model(d / "target_padded.gguf", seed=1, extra_tokens=64),
        "draft_padded": write_tiny_model(d / "draft_padded.gguf", seed=1, noise=0.05, noise_seed=7, extra_tokens=64),
        "mamba": write_tiny_mamba(d / "mamba.gguf", seed=1),
    }


@pytest.fixture(scope="session")
def tiny_models(tiny_paths):
    """Loaded tiny models, one thread each (thread start-up dominates a model this small)."""
    from specserve.backends import load_model

    models = {name: load_model(str(p), n_threads=1) for name, p in tiny_paths.items()}
    yield models
    for m in models.values():
        m.close()


@pytest.fixture(scope="session")
def real_model_paths() -> dict[str, Path]:
    """The packaged real models, pulled into the cache on first use (CI pulls them up front)."""
    from specserve import models

    return {name: Path(models.ensure(name)) for name in ("smollm2-q4_1", "smollm2-f16", "gemma")}


# The tiers. `pytest -m "not real_models and not server and not ray and not browser"` is the fast core
# (verifier, sampling, drafters, auto, grammar, request models on tiny models); plain `pytest` runs all.
# A test that loads a packaged model or starts a server must say so, and the guard below holds it to it:
# unmarked, models.ensure and ServerProcess fail the test instead of quietly slowing the fast tier.
TIERS = {
    "real_models": "loads a packaged real model (pulled by `specserve models pull`)",
    "server": "starts a real `specserve serve` on a free port",
    "ray": "starts a local Ray with Serve replicas",
    "browser": "drives headless Chromium",
}


def pytest_configure(config) -> None:
    for name, what in TIERS.items():
        config.addinivalue_line("markers", f"{name}: {what}")


def pytest_collection_modifyitems(items) -> None:
    for item in items:
        if "real_model_paths" in item.fixturenames:
            item.add_marker("real_models")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """The tier guard, around the whole of a test's run (module fixtures set up for it included)."""
    import server_fixtures
    from specserve import models

    marks = {m.name for m in item.iter_markers()}
    ensure, allowed = models.ensure, server_fixtures.SERVER_ALLOWED
    if "real_models" not in marks:
        def unmarked_ensure(name, *a, **kw):
            pytest.fail(f"{item.nodeid} loads the packaged model {name!r}: mark it real_models")
        models.ensure = unmarked_ensure
    server_fixtures.SERVER_ALLOWED = "server" in marks
    try:
        return (yield)
    finally:
        models.ensure, server_fixtures.SERVER_ALLOWED = ensure, allowed
