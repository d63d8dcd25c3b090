"""`specserve serve --replicas N`: the serve command's settings as the cluster's, on Ray Serve.

Imported only where replicas are asked for (cli/serve.py): it needs the `ray` extra.
"""
from __future__ import annotations

from ..cluster.app import ScaleConfig, build
from ..cluster.replica import ReplicaSpec
from ..cluster.serve import ClusterError
from ..cluster.serve import run as run_cluster
from ..config import ModelConfig
from ..server.state import ServerSettings
from .common import CliError


def scale_config(args, cfg: ModelConfig) -> ScaleConfig:
    """The replica count and autoscaling flags; raises CliError(2) on bad values."""
    try:
        return ScaleConfig(replicas=args.replicas or 1, min_replicas=args.min_replicas,
                           max_replicas=args.max_replicas, target_ongoing=args.target_ongoing,
                           upscale_delay_s=args.upscale_delay, downscale_delay_s=args.downscale_delay,
                           cpus_per_replica=float(cfg.n_threads or 1))
    except ValueError as e:
        raise CliError(str(e), 2) from None


def application(args, cfg: ModelConfig, settings: ServerSettings):
    """The Ray Serve application (`serve run`'s entry, cli/serve.py's app_builder)."""
    return build(ReplicaSpec(cfg, settings), scale_config(args, cfg))


def run(args, cfg: ModelConfig, settings: ServerSettings) -> int:
    """Serve on Ray Serve until a signal; CliError where the application does not start."""
    scale = scale_config(args, cfg)
    try:
        return run_cluster(ReplicaSpec(cfg, settings), scale, args.host, args.port)
    except ClusterError as e:
        raise CliError(str(e)) from None
