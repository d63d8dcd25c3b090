"""Router mode (`specserve serve --models-dir DIR` / `--models-from STORES`), as llama-server's: no model in
this process; each model asked for runs as its own `specserve serve` child on a loopback port, and every
request goes to the child of the model it names.

`child` (one model's process), `pool` (which are loaded, loads and unloads, least recently used first out),
`proxy` (a request in, its answer streamed back), `listing` (the model lists' entries), `preset`
(--models-preset's INI), `app` (the endpoints). Discovery is specserve/stores.py.
"""
