"""Past one machine: specserve engines as Ray Serve replicas behind one endpoint.

Layout: `routing` (routing keys and the prefix-affinity ranking, pure), `router` (that
ranking as a Ray Serve request router), `replica` (one engine running the single server's
app in-process), `ingress` (the HTTP front: access checks, forwarding, retries, /health,
/metrics), `registry` (where replicas report health and metrics), `metrics_merge`,
`app` (the application and its scaling config), `serve` (`specserve serve --replicas`).
Ray is an optional extra (`pip install 'specserve[ray]'`); only `routing` and
`metrics_merge` import without it.
"""
