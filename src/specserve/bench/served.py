"""The benchmark through `specserve serve`, the path users take: a server of the bench's own.

`ServedModels` starts one `specserve serve` per draft model on a free loopback port, with the
bench's models, context and threads, and runs each configuration as one streamed
/v1/completions request: the prompt as the very token ids the in-process run evaluates, the
configuration as the request's `speculative` object, `cache_prompt: false` for the same cold
cache, the same seed. A run's statistics are the server's own (usage.speculative: passes,
drafts, the drafters' steps, its decode time and, under a schema, its grammar time), and its
speed is what the client saw: tokens over the time from sending the request to its last chunk,
less the server's prompt processing, so that it compares with an in-process run's decode speed
and counts everything the server path adds to each step (the engine thread, the event loop, the HTTP stream).
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx

from ..config import SUFFIX_MAX_DEFAULT, SamplingParams
from .endpoint import EndpointError, native_stream

STARTUP_S = 900.0  # loading an F16 1.5B target and its draft on a busy 2-core machine


class ServerFailed(RuntimeError):
    """The bench's own server did not start, or failed a request."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SpawnedServer:
    """`specserve serve ARGS` on a free loopback port, its log in a temporary file (or kept at `log_path`),
    stopped by SIGTERM."""

    def __init__(self, args: list[str], env: dict | None = None, log_path: str | None = None):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._keep_log = log_path is not None
        self._log = open(log_path, "wb") if log_path else tempfile.NamedTemporaryFile(
            prefix="specserve-bench-serve-", suffix=".log", delete=False)
        cmd = [sys.executable, "-m", "specserve", "serve", *args, "--host", "127.0.0.1", "--port", str(self.port)]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env={**os.environ, **(env or {})})
        self._wait_ready()

    def log_tail(self, n: int = 2000) -> str:
        with open(self._log.name, errors="replace") as f:
            return f.read()[-n:]

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerFailed(f"specserve serve exited with status {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise ServerFailed(f"specserve serve was not ready after {STARTUP_S:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # drains, saves what auto learnt, exits
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        if not self._keep_log:
            os.unlink(self._log.name)


def log_name(draft: str | None) -> str:
    """The file a served bench keeps one server's log in: serve-DRAFT.log, DRAFT the draft as named less any
    folder and .gguf (serve-target.log for a server without one)."""
    name = os.path.basename(draft or "target").removesuffix(".gguf")
    return "serve-" + re.sub(r"[^A-Za-z0-9._@-]", "_", name) + ".log"


class ServedModels:
    """The bench's configurations through servers of its own: one per draft model (the target alone,
    prompt lookup and suffix through the first)."""

    def __init__(self, target_path: str, draft_paths: dict[str, str], n_ctx: int, threads: int | None,
                 parallel: int, auto_profile: bool, timeout: float = 3600.0, windows: dict[str, int] | None = None,
                 n_gpu_layers: tuple[int, int] = (0, 0), exact: bool = False, home=None, log_dir: str | None = None):
        """windows: a draft's --draft-ctx by its name (default: the server's); n_gpu_layers: the target's and
        the drafts' layers on the GPU (-ngl, -ngld), as the in-process path loads them; exact: --exact;
        home: a profiles.ProfileHome the servers start auto from (closed with them), or None: the user's profile;
        log_dir: where each server's log is kept (`log_name`), or None: thrown away with the server."""
        common = ["-m", target_path, "-c", str(n_ctx), "-np", str(parallel)]
        common += ["-t", str(threads)] if threads else []
        common += ["-ngl", str(n_gpu_layers[0])] if n_gpu_layers[0] else []
        common += [] if auto_profile else ["--no-auto-profile"]
        common += ["--exact"] if exact else []
        self.servers: dict[str | None, SpawnedServer] = {}
        self._home = home
        self._client = httpx.Client(timeout=timeout)
        try:
            for name, path in (draft_paths or {None: None}).items():
                window = (windows or {}).get(name)
                draft = ["-md", path] if path else []
                draft += ["-ngld", str(n_gpu_layers[1])] if path and n_gpu_layers[1] else []
                draft += ["--draft-ctx", str(window)] if path and window is not None else []
                log = os.path.join(log_dir, log_name(name)) if log_dir else None
                self.servers[name] = SpawnedServer(common + draft, env=home.env if home else None, log_path=log)
        except BaseException:
            self.close()
            raise

    def url(self, draft: str | None) -> str:
        return self.servers[draft if draft in self.servers else next(iter(self.servers))].url

    def run(self, config, tokens: list[int], sampling: SamplingParams, verify: str,
            scope: str | None = None, schema: dict | None = None) -> tuple[dict, str]:
        """(stats, text) of one streamed request: the configuration's `speculative` object over the
        server's defaults, from a cold cache; constrained to `schema` (the body's `json_schema`) if given."""
        mode = "auto" if config.spec == "auto-fresh" else config.spec
        k = config.draft_max if mode != "none" else 0
        speculative = {"mode": mode, "draft_max": k, "suffix_max": k if mode == "suffix" else SUFFIX_MAX_DEFAULT,
                       "cross_request": scope is not None, "cross_request_scope": scope or "", "verify": verify}
        body = {"prompt": tokens, "max_tokens": sampling.max_tokens, "temperature": sampling.temperature,
                "seed": sampling.seed, "ignore_eos": sampling.ignore_eos, "stream": True,
                "stream_options": {"include_usage": True}, "cache_prompt": False, "speculative": speculative}
        if schema is not None:
            body["json_schema"] = schema
        url = self.url(config.draft_model) + "/v1/completions"
        parts, usage, finish = [], None, ""
        t_first = t_last = 0.0
        try:
            for t, event in native_stream(self._client, url, body):
                usage = event.get("usage") or usage
                for choice in event.get("choices") or []:
                    finish = choice.get("finish_reason") or finish
                    if choice.get("text"):
                        parts.append(choice["text"])
                        t_last = t
                        t_first = t_first or t_last
        except EndpointError as e:
            raise ServerFailed(str(e)) from None
        if usage is None:
            raise ServerFailed(f"{url}: the stream ended without usage")
        return served_stats(usage, t_first, t_last, finish), "".join(parts)

    def close(self) -> None:
        self._client.close()
        for server in self.servers.values():
            server.stop()
        self.servers = {}
        if self._home is not None:  # after the servers, which save what they learnt into it as they stop
            self._home.close()
            self._home = None


def served_stats(usage: dict, t_first: float, t_last: float, finish: str) -> dict:
    """A served run's statistics, in the shape of GenerationStats.as_dict() where they exist."""
    spec = usage.get("speculative") or {}
    n = int(usage.get("completion_tokens", 0))
    t_prompt = float(spec.get("prompt_s", 0.0))
    decode = t_last - t_prompt  # the client's view: sent -> last chunk, less the server's prompt
    grammar = {}
    if "grammar_s" in spec:  # a constrained request: the server's time in the grammar (masks, matcher)
        t = float(spec["grammar_s"])
        grammar = {"t_grammar_s": t, "grammar_ms_per_token": round(1000 * t / n, 4) if n else 0.0}
    return {"n_prompt": int(usage.get("prompt_tokens", 0)), "n_generated": n,
            "n_passes": int(spec.get("passes", 0)), "n_drafted": int(spec.get("drafted", 0)),
            "n_accepted": int(spec.get("accepted", 0)), "acceptance": float(spec.get("acceptance", 0.0)),
            "mean_accepted_len": float(spec.get("mean_accepted_len", 0.0)),
            "drafted_by_position": list(spec.get("drafted_by_position") or []),
            "accepted_by_position": list(spec.get("accepted_by_position") or []),
            "drafter_steps": dict(spec.get("drafter_steps") or {}),
            "t_prompt_s": round(t_prompt, 4), "t_decode_server_s": round(float(spec.get("decode_s", 0.0)), 4),
            "t_decode_client_s": round(decode, 4), "time_to_first_token_s": round(t_first, 4),
            "t_last_token_s": round(t_last, 4),
            "tokens_per_s": round(n / decode, 2) if n and decode > 0 else 0.0,
            "decode_tokens_per_s": round((n - 1) / (t_last - t_first), 2) if n > 1 and t_last > t_first else 0.0,
            "server_tokens_per_s": float(spec.get("tokens_per_s", 0.0)), "finish_reason": finish, **grammar}
