"""The HTTP edge, which knows nothing of generation: the listener (uvicorn with deadlines, connection
limits and draining), the guards (Host, Origin, API key), errors and their body shapes, reading a
body as JSON, server-sent events, and the `Endpoint` an API adapter declares its routes with."""
