"""Run the real `specserve serve` as a subprocess on a free port, with tiny models.

Used by the server test modules: `tiny_pair` writes a target and a close draft,
`ServerProcess` starts the server, waits for /health and stops it with SIGTERM; `post`, `chat`,
`events` and `metrics` ask it, each checking the answer's status first.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import tiny_models  # noqa: E402

API_KEY = "test-key"
STARTUP_TIMEOUT = 60.0  # seconds; imports and model loading on a busy 2-core machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float = 30) -> bool:
    """Whether predicate() came true within timeout seconds (polled every 20 ms)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def tiny_pair(directory: Path) -> tuple[Path, Path]:
    """A tiny target and a close draft of it (same vocabulary, 5% weight noise)."""
    target = tiny_models.write_tiny_model(directory / "tiny.gguf", seed=1)
    draft = tiny_models.write_tiny_model(directory / "tiny_draft.gguf", seed=1, noise=0.05, noise_seed=7)
    return target, draft


def tiny_tools_pair(directory: Path) -> tuple[Path, Path]:
    """tiny_pair with Qwen2.5's chat template, its <tool_call> tags as added tokens and its FIM
    tokens: a model that serves OpenAI tools (and /infill) as Qwen2.5 does."""
    fim = ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")
    kw = dict(seed=1, chat_template=tiny_models.QWEN_TOOLS_TEMPLATE, added_tokens=tiny_models.TOOL_TAGS,
              control_tokens=fim)
    target = tiny_models.write_tiny_model(directory / "tiny.gguf", **kw)
    draft = tiny_models.write_tiny_model(directory / "tiny_draft.gguf", noise=0.05, noise_seed=7, **kw)
    return target, draft


def tiny_reasoning_pair(directory: Path) -> tuple[Path, Path]:
    """tiny_pair with a Qwen3-Thinking-style chat template (the generation prompt opens `<think>`), its
    <think>/</think> and <tool_call>/</tool_call> tags as added tokens: a reasoning model."""
    kw = dict(seed=1, chat_template=tiny_models.QWEN3_THINKING_TEMPLATE,
              added_tokens=tiny_models.THINK_TAGS + tiny_models.TOOL_TAGS)
    target = tiny_models.write_tiny_model(directory / "tiny.gguf", **kw)
    draft = tiny_models.write_tiny_model(directory / "tiny_draft.gguf", noise=0.05, noise_seed=7, **kw)
    return target, draft


# Set per test by conftest's tier guard: only a test marked `server` may start one.
SERVER_ALLOWED = True


class ServerProcess:
    """`python -m specserve serve ARGS --port FREE`, its stderr kept in a file."""

    def __init__(self, args: list[str], log_path: Path, api_key: str | None = None, env: dict | None = None):
        if not SERVER_ALLOWED:
            pytest.fail("this test starts a server: mark it server")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        self.log_path = log_path
        cmd = [sys.executable, "-m", "specserve", "serve", *args, "--port", str(self.port)]
        if api_key:
            cmd += ["--api-key", api_key]
        self._log = open(log_path, "wb")
        env = {**{k: v for k, v in os.environ.items() if k != "SPECSERVE_API_KEY"}, "PYTHONUNBUFFERED": "1",
               **(env or {})}
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        self._wait_ready()

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def client(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=60, **kw)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server not ready after {STARTUP_TIMEOUT} s:\n{self.log()[-3000:]}")

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM, wait (SIGKILL past `timeout`); returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@pytest.fixture(scope="session")
def tiny_models_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("server_models")
    tiny_pair(d)
    return d


def serve_args(models: Path, *extra: str) -> list[str]:
    return ["-m", str(models / "tiny.gguf"), "-md", str(models / "tiny_draft.gguf"), "-t", "1", *extra]


def _response(http, path: str, body: dict, status: int) -> httpx.Response:
    if isinstance(http, ServerProcess):
        with http.client() as c:
            return _response(c, path, body, status)
    r = http.post(path, json=body)
    assert r.status_code == status, r.text
    return r


def post(http, path: str, body: dict, status: int = 200) -> dict:
    """POST `body` as JSON to `path` and return the answer's JSON, once its status is `status` (else fail showing
    the answer). http: an httpx.Client on a server, or a ServerProcess (a client for this request)."""
    return _response(http, path, body, status).json()


def post_bytes(http, path: str, body: dict, status: int = 200) -> bytes:
    """As `post`, the answer's bytes as they came (a whole answer or a whole stream)."""
    return _response(http, path, body, status).content


def chat(http, body: dict, **fields) -> dict:
    """`post` to /v1/chat/completions: `body` (a module's usual request) with `fields` over it."""
    return post(http, "/v1/chat/completions", {**body, **fields})


def events(http, path: str, body: dict) -> list[dict]:
    """The JSON events of a streamed answer (its `data:` lines but [DONE]), once its status is 200. The body
    should ask for a stream."""
    with http.stream("POST", path, json=body) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ") and line[6:] != "[DONE]"]


def streamed_logprobs(http, body: dict) -> list[dict]:
    """The chat `body` streamed: every chunk's logprobs `content`, in order (the whole answer's, to compare)."""
    return [lp for e in events(http, "/v1/chat/completions", {**body, "stream": True}) for c in e["choices"]
            for lp in (c.get("logprobs") or {}).get("content") or []]


def metrics(http) -> dict[str, float]:
    """GET /metrics: every sample as 'name{labels}' -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(http.get("/metrics").text):
        for s in fam.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out
