"""The server's state, typed: `server_of` finds it from a request or the app, and it has every part that
core names it by (core/server_parts.py's ServerParts, since core sits below state.py). No server process:
the app over a tiny model, its engine thread started and stopped."""
from __future__ import annotations

import inspect
import typing

import pytest
from starlette.requests import Request

from specserve.engine import Engine
from specserve.server import ServerSettings, create_app, server_of
from specserve.server.core.server_parts import JobSettings, ServerParts
from specserve.server.state import ServerState


@pytest.fixture
def app(tiny_models):
    app = create_app(Engine(tiny_models["target"], None, n_ctx=256), ServerSettings("tiny", parallel=2))
    yield app
    state = server_of(app)
    state.grammars.close()
    state.scheduler.close()


def test_server_of_finds_the_state_from_a_request_and_from_the_app(app):
    state = server_of(app)
    assert isinstance(state, ServerState) and state.n_slots == 2
    assert server_of(Request({"type": "http", "app": app, "method": "GET", "path": "/", "headers": []})) is state


def test_the_state_has_every_part_core_reads_of_it(app):
    state = server_of(app)
    parts = typing.get_type_hints(ServerParts)
    assert set(parts) == {"engine", "scheduler", "metrics", "slot_records", "grammars"}
    for name, kind in parts.items():
        assert isinstance(getattr(state, name), kind), name
    assert isinstance(inspect.getattr_static(ServerParts, "settings"), property)
    read = [name for name, v in vars(JobSettings).items() if isinstance(v, property)]
    assert sorted(read) == ["reasoning_budget", "reasoning_format", "template_kwargs"]
    hints = typing.get_type_hints(ServerSettings)
    for name in read:
        assert name in hints and getattr(state.settings, name) is not None, name
