"""The Ray Serve application: ingress -> engine replicas (+ the registry), and how to run it.

    specserve serve --pair smollm2 --replicas 2 -t 1 -np 2        # a local Ray, started here
    RAY_ADDRESS=auto specserve serve --replicas 4 ...             # an existing cluster
    serve run specserve.cluster.app:app_builder flags="--pair smollm2 --replicas 2 -t 1"

`build(spec, scale)` is the application; `app_builder` is the `serve run` entry, taking the
same flags as `specserve serve`. Autoscaling follows Ray Serve's autoscaling config on the
engine deployment: requests in flight per replica against a target (default: its slots).
"""
from __future__ import annotations

import dataclasses
import logging
import shlex
from dataclasses import dataclass

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


def from_args(args):
    """(ReplicaSpec, ScaleConfig) from `specserve serve` flags; raises CliError(2) on bad values."""
    from ..cli.common import CliError, model_config
    from ..cli.serve import settings_from

    cfg = model_config(args)
    settings = settings_from(args, cfg.target_path)
    if not args.no_cross_request:
        cfg = dataclasses.replace(cfg, cross_request_bytes=int(args.cross_request_mib * (1 << 20)))
    try:
        scale = ScaleConfig(replicas=args.replicas or 1, min_replicas=args.min_replicas,
                            max_replicas=args.max_replicas, target_ongoing=args.target_ongoing,
                            upscale_delay_s=args.upscale_delay, downscale_delay_s=args.downscale_delay,
                            cpus_per_replica=float(cfg.n_threads or 1))
    except ValueError as e:
        raise CliError(str(e), 2) from None
    return ReplicaSpec(cfg, settings), scale


def app_builder(args: dict):
    """`serve run specserve.cluster.app:app_builder flags="..."`: the flags of `specserve serve`
    (--host/--port are Serve's own there: `serve run --port`)."""
    from ..cli import build_parser

    ns = build_parser().parse_args(["serve", *shlex.split(args.get("flags", ""))])
    spec, scale = from_args(ns)
    return build(spec, scale)
