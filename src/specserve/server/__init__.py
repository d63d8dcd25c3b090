"""The HTTP server: OpenAI-compatible and llama-server-compatible endpoints over one Engine.

Layout: `app` (routes, auth, lifespan), `openai_api` and `llama_api` (endpoints),
`params` (request validation), `jobs` (one request's generation), `scheduler`
(the engine thread, slots and queue), `metrics` (Prometheus, request log line),
`profiles` (named presets), `errors` (OpenAI error shape). The load and interference tools that
measure a server are in specserve/tools.
"""
from .app import create_app
from .state import ServerSettings

__all__ = ["ServerSettings", "create_app"]
