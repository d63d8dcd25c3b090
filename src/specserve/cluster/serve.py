"""`specserve serve --replicas N`: deploy the application on Ray and serve until a signal.

`run(spec, scale, host, port)` takes the settings objects (cli/serve.py and cli/replicas.py make them from the flags).

Without RAY_ADDRESS a Ray instance is started in this process with just enough CPUs
(this machine's count, or more if the replicas reserve more); with RAY_ADDRESS (e.g.
`auto`, or `ray://head:10001`) the application is deployed on that cluster, and every
node must hold the model files at the same paths. The first SIGTERM/SIGINT shuts the
application down (replicas get --drain-timeout to finish what they run), then Ray.
"""
from __future__ import annotations

import logging
import os
import signal
import threading

import ray  # ImportError here tells `specserve serve` that the extra is missing

from ray import serve

from .app import APP_NAME, ScaleConfig, build
from .replica import ReplicaSpec

log = logging.getLogger("specserve.cluster")


class ClusterError(RuntimeError):
    """The application did not start on Ray Serve."""


def run(spec: ReplicaSpec, scale: ScaleConfig, host: str, port: int) -> int:
    """Deploy, serve until SIGTERM/SIGINT, shut down; 0 when done. Raises ClusterError."""
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=True)
    else:
        peak = scale.max_replicas or scale.replicas
        ray.init(num_cpus=max(os.cpu_count() or 1, int(peak * scale.cpus_per_replica + 0.999)),
                 include_dashboard=False, log_to_driver=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": host, "port": port})
        log.info("deploying %d engine replica(s) of %s (%s threads, %d slots, queue %d each)%s on %s:%d",
                 scale.replicas, spec.settings.model_name, spec.model.n_threads, spec.settings.parallel,
                 spec.settings.queue, f", autoscaling {scale.min_replicas}..{scale.max_replicas}"
                 if scale.autoscaling else "", host, port)
        try:
            serve.run(build(spec, scale), name=APP_NAME, route_prefix="/", blocking=False)
        except RuntimeError as e:
            raise ClusterError(f"the application did not start: {e}") from None
        log.info("serving on http://%s:%d (Ray Serve)", host, port)
        while not stop.wait(1.0):
            pass
    finally:
        _shutdown(spec.settings.drain_timeout + 15, whole_serve=not address)
    return 0


def _shutdown(timeout: float, whole_serve: bool) -> None:
    """Delete the application (replicas finish what they run), and Serve too where this process started
    Ray (`whole_serve`; on a shared cluster other applications go on); then disconnect or stop Ray.
    Never waits past `timeout`."""
    def stop_serve() -> None:
        try:
            log.info("shutting down the replicas")
            serve.shutdown() if whole_serve else serve.delete(APP_NAME)
        except Exception as e:  # noqa: BLE001 - Ray itself may be going down (Ctrl-C reaches its processes)
            log.warning("while shutting Serve down: %s", e)

    t = threading.Thread(target=stop_serve, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        log.warning("Serve did not shut down within %g s; stopping Ray anyway", timeout)
    ray.shutdown()
