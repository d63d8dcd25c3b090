"""Ollama's API (/api/chat, /api/generate, /api/tags, /api/show, /api/ps, /api/version, /api/embed,
/api/embeddings), single-model mode."""
