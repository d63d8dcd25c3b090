"""One adapter per API: each owns the pydantic models of its request bodies (validation.py says how
their errors read), turns a body into the one GenRequest (core/request.py), and shapes the answer's
events (core/answer.py) into its own JSON and stream. `routes()` lists its endpoints for the app."""
