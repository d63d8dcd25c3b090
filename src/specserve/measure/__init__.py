"""Measurement tools, run by hand against a server or the models; nothing else in the package imports them.

`loadtest` (mixed chat requests from N clients: aggregate tokens/s, latency, time per output token),
`interference` (what a long prompt arriving costs the streams already running), `loadcheck` (the
replicated endpoint against one server: same greedy text, load, a replica killed under load) and
`perf_hotpath` (where a decoding step's Python time goes). Each is `python -m specserve.measure.NAME`;
what they measured is in docs/serving.md, docs/scaling.md and docs/measurements.md.
"""
