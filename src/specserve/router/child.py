"""One loaded model: a `specserve serve` child process on a free loopback port, as llama-server's router
runs each model.

The child dies with the router: it is started with PR_SET_PDEATHSIG (Linux), so a router killed
outright (SIGKILL, a crash) takes its children with it; a router stopped by a signal stops them
itself (SIGTERM, which drains the child's requests in flight, then SIGKILL past the deadline). The
child's output goes to the router's log, each line prefixed with the model's name, and its last
lines are kept: they say why a child that exits failed.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import logging
import os
import signal
import socket
import sys
import time

import httpx

log = logging.getLogger("specserve.router")
_PR_SET_PDEATHSIG = 1
TAIL_LINES = 40
STOP_TIMEOUT_S = 30.0  # after SIGTERM (the child drains for its --drain-timeout), then SIGKILL


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _die_with_parent(parent: int):
    """preexec_fn: in the child between fork and exec, ask the kernel for SIGKILL when the parent dies
    (and exit at once if it died already, before the request took effect)."""
    def preexec() -> None:
        if sys.platform.startswith("linux"):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)
    return preexec


class ChildFailed(Exception):
    """The child exited (or never answered) before it was ready: `reason` says why, from its last lines."""

    def __init__(self, reason: str, exit_code: int | None):
        super().__init__(reason)
        self.reason = reason
        self.exit_code = exit_code


class Child:
    """`python -m specserve serve ARGS --host 127.0.0.1 --port P` for the model `name`; its API key is
    the router's own secret, given in the environment (ps shows the command line, not that)."""

    def __init__(self, name: str, args: list[str], key: str):
        self.name = name
        self.args = args
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.key = key
        self.proc: asyncio.subprocess.Process | None = None
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.stopping = False  # an exit after stop() is not a failure
        self.started_at = 0.0
        self._reader: asyncio.Task | None = None

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-m", "specserve", "serve", *self.args, "--host", "127.0.0.1",
                "--port", str(self.port)]

    async def start(self, timeout: float) -> None:
        """Start it and wait until its /health answers 200; ChildFailed if it exits or times out first."""
        env = {**os.environ, "SPECSERVE_API_KEY": self.key, "PYTHONUNBUFFERED": "1"}
        self.started_at = time.monotonic()
        self.proc = await asyncio.create_subprocess_exec(
            *self.command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, env=env, preexec_fn=_die_with_parent(os.getpid()),
            start_new_session=True)  # a terminal's Ctrl-C reaches the router, which stops the children itself
        self._reader = asyncio.create_task(self._read_output())
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=1.0) as client:
            while True:
                if self.proc.returncode is not None:
                    await self._drain_reader()
                    raise ChildFailed(self.reason(), self.proc.returncode)
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get(self.url + "/health")).status_code == 200:
                        return
                if time.monotonic() > deadline:
                    await self.stop(1.0)
                    raise ChildFailed(f"not ready after {timeout:g} s; its last output: {self.reason()}", None)
                await asyncio.sleep(0.05)

    async def props(self) -> dict:
        """Its /props (the draft it chose, its context); {} where it does not answer."""
        try:
            async with httpx.AsyncClient(timeout=5.0) as client:
                r = await client.get(self.url + "/props", headers={"Authorization": f"Bearer {self.key}"})
                return r.json() if r.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            return {}

    async def _read_output(self) -> None:
        """Its output, line by line, into the log and the tail, read to its end whatever it writes (a pipe
        left unread would stop the child at its next write once full)."""
        assert self.proc is not None and self.proc.stdout is not None
        pending = b""
        while chunk := await self.proc.stdout.read(1 << 16):
            *lines, pending = (pending + chunk).split(b"\n")
            if len(pending) > 1 << 16:  # no newline in 64 KiB: shown as a line of its own
                lines, pending = [*lines, pending], b""
            for raw in lines:
                self._line(raw)
        self._line(pending)

    def _line(self, raw: bytes) -> None:
        line = raw.decode("utf-8", "replace").rstrip()
        if line:
            self.tail.append(line[:2000])
            log.info("[%s] %s", self.name, line)

    async def _drain_reader(self) -> None:
        if self._reader is not None:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._reader, 2.0)

    def reason(self) -> str:
        """Why it failed, from its output: the last error line it printed, else its last lines."""
        lines = list(self.tail)
        errors = [x for x in lines if "error" in x.lower() or "Traceback" in x or "failed" in x.lower()]
        picked = errors[-1:] if errors else lines[-3:]
        code = None if self.proc is None else self.proc.returncode
        said = " | ".join(picked) if picked else "no output"
        return f"exit status {code}: {said}" if code is not None else said

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def wait(self) -> int:
        assert self.proc is not None
        code = await self.proc.wait()
        await self._drain_reader()
        return code

    async def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM (its requests in flight drain), SIGKILL past `timeout`; waits for its exit."""
        self.stopping = True
        if self.proc is None or self.proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), timeout)
        except asyncio.TimeoutError:
            log.warning("model %s: no exit %g s after SIGTERM, killing it", self.name, timeout)
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()
        await self._drain_reader()

    def kill_now(self) -> None:
        """SIGKILL without waiting: the router is exiting and cannot wait for a drain."""
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
