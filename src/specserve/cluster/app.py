"""The Ray Serve application: ingress -> engine replicas (+ the registry), and how to run it.

    specserve serve --pair smollm2 --replicas 2 -t 1 -np 2        # a local Ray, started here
    RAY_ADDRESS=auto specserve serve --replicas 4 ...             # an existing cluster
    serve run specserve.cli.serve:app_builder flags="--pair smollm2 --replicas 2 -t 1"

`build(spec, scale)` is the application, from settings objects (`cli/serve.py` and `cli/replicas.py`
make them from `specserve serve`'s flags; `cli/serve.py`'s `app_builder` is the `serve run` entry).
Autoscaling follows Ray Serve's autoscaling config on the engine deployment: requests in flight per
replica against a target (default: its slots).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .replica import ReplicaSpec

log = logging.getLogger("specserve.cluster")
APP_NAME = "specserve"


@dataclass(frozen=True)
class ScaleConfig:
    """How many engine replicas, what each holds, and when Serve adds or removes them."""

    replicas: int = 2  # fixed count; with autoscaling, the count it starts from
    min_replicas: int | None = None  # set either bound to autoscale
    max_replicas: int | None = None
    target_ongoing: float | None = None  # requests in flight per replica Serve aims for (default: slots)
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 300.0
    cpus_per_replica: float = 1.0  # Ray's CPU reservation: the replica's llama.cpp threads
    ingress_replicas: int = 1

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"--replicas must be >= 1, got {self.replicas}")
        lo, hi = self.min_replicas, self.max_replicas
        if lo is not None and lo < 0 or hi is not None and hi < 1:
            raise ValueError("--min-replicas must be >= 0 and --max-replicas >= 1")
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"--min-replicas ({lo}) exceeds --max-replicas ({hi})")
        if self.autoscaling and not (lo or 0) <= self.replicas <= (hi or self.replicas):
            raise ValueError(f"--replicas ({self.replicas}) must lie within [--min-replicas, --max-replicas]")
        if self.target_ongoing is not None and not self.target_ongoing > 0:
            raise ValueError(f"--target-ongoing must be > 0, got {self.target_ongoing}")
        if not self.cpus_per_replica > 0 or self.ingress_replicas < 1:
            raise ValueError("CPUs per replica must be > 0 and ingress replicas >= 1")

    @property
    def autoscaling(self) -> bool:
        return self.min_replicas is not None or self.max_replicas is not None

    def engine_options(self, slots: int, queue: int, drain_timeout: float) -> dict:
        """Ray Serve deployment options for the engine deployment."""
        opts = {
            # Ray sends a replica no more than its server would accept; beyond, requests wait in the router.
            "max_ongoing_requests": slots + queue,
            "ray_actor_options": {"num_cpus": self.cpus_per_replica},
            "graceful_shutdown_timeout_s": drain_timeout,
            "health_check_period_s": 5.0,
            "health_check_timeout_s": 60.0,  # generous: processes here may be paused for a while
        }
        if self.autoscaling:
            opts["autoscaling_config"] = {
                "min_replicas": self.min_replicas if self.min_replicas is not None else 1,
                "initial_replicas": self.replicas,
                "max_replicas": self.max_replicas if self.max_replicas is not None else self.replicas,
                "target_ongoing_requests": self.target_ongoing or slots,
                "upscale_delay_s": self.upscale_delay_s, "downscale_delay_s": self.downscale_delay_s}
        else:
            opts["num_replicas"] = self.replicas
        return opts


def build(spec: ReplicaSpec, scale: ScaleConfig):
    """The application: Ingress (HTTP) -> Engine (PrefixAffinityRouter) -> replicas; Registry beside."""
    # Ray is an optional extra: ScaleConfig above imports (and is tested) without it.
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from .ingress import Ingress
    from .registry import Registry
    from .replica import EngineReplica
    from .router import PrefixAffinityRouter

    s = spec.settings
    registry = serve.deployment(Registry, name="Registry", num_replicas=1,
                                ray_actor_options={"num_cpus": 0},
                                logging_config={"enable_access_log": False}).bind()  # a report a second
    router = RequestRouterConfig(request_router_class=PrefixAffinityRouter,
                                 request_router_kwargs={"overload": s.parallel})
    engine = serve.deployment(EngineReplica, name="Engine", request_router_config=router,
                              **scale.engine_options(s.parallel, s.queue, s.drain_timeout)).bind(spec, registry)
    ingress = serve.deployment(serve.ingress()(Ingress), name="Ingress", num_replicas=scale.ingress_replicas,
                               max_ongoing_requests=s.max_connections,
                               ray_actor_options={"num_cpus": 0}).bind(engine, registry, s, APP_NAME)
    return ingress
