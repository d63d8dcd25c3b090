"""Ollama's API (/api/chat, /api/generate, /api/tags, /api/show, /api/ps, /api/version), single-model mode."""
