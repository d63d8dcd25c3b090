"""`specserve serve --cache-reuse N` through a real server: an editor's window that lost its first
lines (the cursor moved down, or lines were deleted above it) is served mostly from the cache."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))
from server_fixtures import ServerProcess, post, serve_args  # noqa: E402
from tiny_models import QWEN_FIM, write_tiny_model  # noqa: E402

pytestmark = pytest.mark.server

LINES = [f"    total += values[{i}] * {i % 7}  # step {i}\n" for i in range(24)]
SUFFIX = "\n    return total\n"


@pytest.fixture(scope="module")
def fim_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("reuse_models")
    write_tiny_model(d / "tiny.gguf", seed=1, control_tokens=QWEN_FIM)
    write_tiny_model(d / "tiny_draft.gguf", seed=1, noise=0.05, noise_seed=7, control_tokens=QWEN_FIM)
    return d


def infill(srv, prefix: str) -> dict:
    body = {"input_prefix": prefix, "input_suffix": SUFFIX, "prompt": "", "n_predict": 4, "temperature": 0,
            "cache_prompt": True}
    return post(srv, "/infill", body)


@pytest.mark.parametrize("reuse", [16, 0])
def test_a_window_shifted_down_is_served_from_the_cache_with_cache_reuse(fim_models, tmp_path, reuse):
    srv = ServerProcess(serve_args(fim_models, "-c", "2048", "--parallel", "1", "--spec", "draft",
                                   "--cache-reuse", str(reuse)), tmp_path / "serve.log")
    try:
        first = infill(srv, "def f(values):\n" + "".join(LINES))
        second = infill(srv, "".join(LINES[3:]))  # the window moved three lines down
    finally:
        assert srv.stop() == 0
    assert "Traceback" not in srv.log()
    n = second["tokens_evaluated"]
    assert n > 500 and first["tokens_cached"] < 0.1 * n  # a long prompt, cold the first time
    if reuse:  # all but the three lines' tokens and the tail generated after the first prompt
        assert second["tokens_cached"] > 0.8 * n
        assert second["timings"]["prompt_n"] == n - second["tokens_cached"]
    else:  # the prompts differ from their first line on: only the layout's header in front is cached
        assert second["tokens_cached"] < 0.1 * n


def test_a_negative_cache_reuse_is_refused_before_loading(fim_models, tmp_path):
    import subprocess

    out = subprocess.run([sys.executable, "-m", "specserve", "serve", *serve_args(fim_models, "--cache-reuse", "-1")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--cache-reuse must be >= 0" in out.stderr
