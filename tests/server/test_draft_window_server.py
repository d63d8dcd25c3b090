"""`specserve serve --draft-ctx N -np 2`: the slots' draft caches are windows of N cells in one shared
context; two long prompts served at once get the target alone's text while their windows slide."""
from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from server_fixtures import ServerProcess, post, serve_args, tiny_models_dir  # noqa: E402,F401
import pytest

pytestmark = pytest.mark.server

PROMPTS = ["".join(f"line {i}: the value of {name}{i} is {i * 7 % 13}\n" for i in range(16)) for name in ("x", "y")]


def _complete(srv, prompt: str, speculative: dict) -> dict:
    body = {"prompt": prompt, "max_tokens": 200, "temperature": 0, "ignore_eos": True, "speculative": speculative}
    return post(srv, "/v1/completions", body)


def test_two_slots_with_draft_windows_get_the_target_alone_text(tiny_models_dir, tmp_path):
    srv = ServerProcess(serve_args(tiny_models_dir, "-c", "2048", "--parallel", "2", "--draft-ctx", "128"),
                        tmp_path / "serve.log")
    try:
        alone = [_complete(srv, p, {"mode": "none"})["choices"][0]["text"] for p in PROMPTS]
        with ThreadPoolExecutor(2) as pool:
            together = list(pool.map(lambda p: _complete(srv, p, {"mode": "draft", "draft_max": 6}), PROMPTS))
    finally:
        assert srv.stop() == 0
    log = srv.log()
    assert "Traceback" not in log
    # the start-up report prices the window (llama.cpp allocates cells by 256)
    assert "KV 256 B/token x 256 = " in log and "its window, --draft-ctx 128" in log
    for text, answer in zip(alone, together):
        usage = answer["usage"]
        assert usage["prompt_tokens"] > 300 and usage["speculative"]["accepted"] > 0  # prompts longer than the window
        assert answer["choices"][0]["text"] == text


def test_a_draft_ctx_below_the_least_window_is_refused_before_loading(tiny_models_dir):
    out = subprocess.run([sys.executable, "-m", "specserve", "serve",
                          *serve_args(tiny_models_dir, "--draft-ctx", "64")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--draft-ctx must be 0 (the whole context) or >= 128, got 64" in out.stderr
