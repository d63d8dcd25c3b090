"""llama-server's own API: /completion, /infill, its token and template endpoints, /props and /slots,
its paths without /v1, and Vertex AI's /predict."""
