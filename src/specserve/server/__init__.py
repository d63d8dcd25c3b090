"""The HTTP server: OpenAI-compatible and llama-server-compatible endpoints over one Engine.

Layout: `app` (the routes of every API, the server's own, lifespan), `state` (settings and what one
server holds); `http/` the edge (listener, guards, errors and their shapes, body reading, SSE);
`apis/` a package per API (openai/, anthropic/, llama/; shared/ the one request builder), each
turning its bodies into the one internal request; `core/` what serves any request
(the request, sampling and speculation over profiles, jobs, scheduler, batcher, the answer's events,
constraints and tools, metrics, trace). The load and interference tools that measure a server are in
specserve/tools.
"""
from .app import create_app
from .state import ServerSettings, server_of

__all__ = ["ServerSettings", "create_app", "server_of"]
