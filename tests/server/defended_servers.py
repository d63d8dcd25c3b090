"""The servers that the tests of the server's defences share, each set up as its threats need.

- guarded: one slot, a queue of two, a 2 s read timeout, a cap of 8 connections, its API key (KEY) from the
  environment, CORS for one origin (WEB).
- tenants: a 1024-token context (N_CTX), one slot, keys from a file (KEY_A and KEY_B confined to scopes of their
  own, ADMIN not), a profile `tenantA` with scope tA.
- limited: short deadlines and small connection limits (1 s for the request line, 4 s to read, 8 connections,
  3 a client address), and a profile `fixed` that pins two fields.

Each is a context manager for a module fixture of the test file that uses it (the guarded one has its fixtures
here: `server` and `http`); on leaving, the server must exit cleanly with no traceback in its log.
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from server_fixtures import ServerProcess, serve_args, wait_for  # noqa: F401 (wait_for: re-exported)

C, CH, L = "/v1/completions", "/v1/chat/completions", "/completion"

KEY = "key-from-the-environment"
WEB = "http://localhost:3000"  # the one origin the guarded server allows
LONG = {"prompt": "the cat", "max_tokens": 8000, "ignore_eos": True, "stream": True, "speculative": {"mode": "none"}}

ADMIN, KEY_A, KEY_B = "admin-key", "key-of-tenant-a", "key-of-tenant-b"
N_CTX = 1024


@contextmanager
def _checked(srv: ServerProcess) -> Iterator[ServerProcess]:
    yield srv
    assert srv.stop() == 0
    assert "Traceback" not in srv.log()


def guarded_server(models: Path, log: Path):
    return _checked(ServerProcess(serve_args(models, "-c", "8192", "--alias", "tiny", "--parallel", "1",
                                             "--queue", "2", "--read-timeout", "2", "--max-connections", "8",
                                             "--cors-origin", WEB),
                                  log, env={"SPECSERVE_API_KEY": KEY}))


@pytest.fixture(scope="module")
def server(tiny_models_dir, tmp_path_factory):
    """The guarded server, for a test module that imports this fixture (and `http`)."""
    with guarded_server(tiny_models_dir, tmp_path_factory.mktemp("guarded") / "serve.log") as srv:
        yield srv


@pytest.fixture(scope="module")
def http(server):
    """A client of the guarded server, with its API key."""
    with httpx.Client(base_url=server.url, headers={"X-Api-Key": KEY}, timeout=60) as c:
        yield c


def tenants_server(models: Path, folder: Path):
    keys = folder / "keys"
    keys.write_text(f"# tenants\n{KEY_A} scope=tA\n{KEY_B}   scope=tB\n\n{ADMIN}\n")
    return _checked(ServerProcess(serve_args(models, "-c", str(N_CTX), "--alias", "tiny", "--parallel", "1",
                                             "--queue", "2", "--api-key-file", str(keys),
                                             "--profile", "tenantA=cross_request_scope=tA"), folder / "serve.log"))


def limited_server(models: Path, log: Path):
    return _checked(ServerProcess(serve_args(models, "-c", "256", "--parallel", "1", "--queue", "1",
                                             "--max-connections", "8", "--max-connections-per-client", "3",
                                             "--request-line-timeout", "1", "--read-timeout", "4",
                                             "--profile", "fixed=temperature=0.5,pinned=temperature+verify"), log))


def client(srv, key: str = ADMIN) -> httpx.Client:
    return httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def expect_error(r: httpx.Response, status: int, param: str | None, code: str | None,
                 kind: str = "invalid_request_error") -> dict:
    """The OpenAI-shaped error of `r`, checked: its status, type, param and code."""
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert (err["type"], err["param"], err["code"]) == (kind, param, code), err
    return err


def health(srv) -> dict:
    return httpx.get(srv.url + "/health").json()
