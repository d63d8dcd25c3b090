"""What an API adapter hands the app for each of its endpoints: path, handler, methods, error shape."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .errors import Render


@dataclass(frozen=True)
class Endpoint:
    """One route of an API. `render_error`: the API's error body for refusals on this path (None:
    OpenAI's). `needs_model`: False where the handler reads only what stays in memory while the server
    sleeps (--sleep-idle-seconds: core/sleep.py), so that a request there does not wake it."""

    path: str
    handler: Callable[[Request], Awaitable[Response]]
    methods: tuple[str, ...] = ("POST",)
    render_error: Render | None = None
    needs_model: bool = True

    def route(self) -> Route:
        return Route(self.path, self.handler, methods=list(self.methods))
