"""A package per API (openai/, anthropic/, llama/) beside shared/: each declares how its bodies become the one
GenRequest (core/request.py) — its pydantic models and an `Api` that shared/builder.py runs — and shapes the
answer's events (core/answer.py) into its own JSON and stream. `routes()` lists an adapter's endpoints."""
