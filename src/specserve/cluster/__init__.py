"""Past one machine: specserve engines as Ray Serve replicas behind one endpoint.

Layout: `routing` (routing keys and the prefix-affinity ranking, pure), `router` (that
ranking as a Ray Serve request router), `replica` (one engine running the single server's
app in-process), `ingress` (the HTTP front: access checks, forwarding, retries, /health,
/metrics), `registry` (where replicas report health and metrics), `metrics_merge`,
`app` (the application and its scaling config), `serve` (deploy and serve until a signal).
Everything here takes settings objects (`cli/serve.py` and `cli/replicas.py` make them from the flags) and raises
its own errors. Ray is an optional extra (`pip install 'specserve[ray]'`); only `routing`,
`metrics_merge` and `app` import without it.
"""
