"""`specserve serve`: the OpenAI-compatible HTTP server.

Loads the models once, then serves until SIGTERM/SIGINT. The first signal drains:
requests in flight finish, new ones get 503, then the process exits 0. A second
signal stops at once.
"""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from .common import CliError, add_model_args, add_spec_args, load_engine, model_config, spec_params

log = logging.getLogger("specserve.server")


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve OpenAI-compatible completions with speculative decoding",
                       description="Serve /v1/completions, /v1/chat/completions, /v1/models, /completion "
                                   "(llama-server), /health and /metrics. Without -m, the packaged default "
                                   "pair is served.")
    add_model_args(p)
    add_spec_args(p)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    g.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    g.add_argument("--api-key", metavar="KEY", help="require 'Authorization: Bearer KEY' (not on /health)")
    g.add_argument("--alias", metavar="NAME", help="the served model's name (default: the target file's stem)")
    g.add_argument("--profile", action="append", default=[], metavar="NAME=OPTIONS",
                   help="a named preset requests select with 'model': e.g. code=spec=draft,draft_max=8 or "
                        "prose=spec=none,temperature=0.8 (repeatable). Options: spec, draft_max, draft_min, "
                        "draft_p_min, ngram_min, ngram_max, suffix_max, cross_request, cross_request_scope, "
                        "temperature, top_k, top_p, min_p, seed, max_tokens, ignore_eos, verify")
    g.add_argument("-np", "--parallel", type=int, default=2, metavar="N",
                   help="slots: requests generating at once, interleaved step by step (default 2)")
    g.add_argument("--queue", type=int, default=16, metavar="N",
                   help="requests waiting for a slot before new ones get 503 (default 16)")
    g.add_argument("--max-body-mib", type=float, default=4.0, metavar="MIB",
                   help="largest request body; bigger ones get 413 (default 4)")
    x = p.add_argument_group("cross-request drafting (the suffix drafter)")
    x.add_argument("--no-cross-request", action="store_true",
                   help="keep no store of earlier requests: the suffix drafter sees only the current request")
    x.add_argument("--cross-request-mib", type=float, default=64.0, metavar="MIB",
                   help="memory for earlier requests' prompt tails and outputs, oldest evicted first "
                        "(default 64: about 1.3M tokens)")
    p.set_defaults(run=run)


def _model_name(given: str | None, target_path: str) -> str:
    """What clients call the served model without --alias: the packaged name, else the file's stem."""
    from ..models import DEFAULT_TARGET

    if given is None:
        return DEFAULT_TARGET
    if not given.endswith(".gguf") and "/" not in given:
        return given  # a packaged model name, e.g. smollm2-f16
    return Path(target_path).stem


def settings_from(args, target_path: str):
    """ServerSettings from the flags; raises CliError(2) on bad values, before any model loads."""
    from ..server import ServerSettings
    from ..server.profiles import Profile, build_profiles

    if args.parallel < 1:
        raise CliError(f"--parallel must be >= 1, got {args.parallel}", 2)
    if args.queue < 0:
        raise CliError(f"--queue must be >= 0, got {args.queue}", 2)
    if not 0 <= args.port <= 65535:
        raise CliError(f"--port must be in [0, 65535], got {args.port}", 2)
    if not args.cross_request_mib > 0:
        raise CliError(f"--cross-request-mib must be > 0, got {args.cross_request_mib}", 2)
    name = args.alias or _model_name(args.model, target_path)
    spec = dataclasses.asdict(spec_params(args))
    try:
        profiles = build_profiles(Profile(name, spec=spec, verify=args.verify), args.profile)
        return ServerSettings(model_name=name, profiles=profiles, parallel=args.parallel, queue=args.queue,
                              api_key=args.api_key or None, max_body=int(args.max_body_mib * (1 << 20)))
    except ValueError as e:
        raise CliError(str(e), 2) from None


def _server_class():
    import uvicorn

    class DrainingServer(uvicorn.Server):
        """uvicorn, with the first signal draining through the scheduler instead of closing at once."""

        def __init__(self, config, scheduler):
            super().__init__(config)
            self.scheduler = scheduler

        def handle_exit(self, sig, frame) -> None:
            # Not uvicorn's: it would re-raise the signal at exit, and the exit status must be 0.
            if self.scheduler.draining:
                log.warning("second signal: stopping now")
                self.should_exit = self.force_exit = True
                return
            self.scheduler.draining = True
            log.info("draining: %d request(s) in flight; new requests get 503", self.scheduler.active)

        async def on_tick(self, counter: int) -> bool:
            if self.scheduler.draining and self.scheduler.idle:
                self.should_exit = True
            return await super().on_tick(counter)

    return DrainingServer


def run(args) -> int:
    import uvicorn

    from ..server import create_app

    cfg = model_config(args)
    settings = settings_from(args, cfg.target_path)
    if not args.no_cross_request:
        cfg = dataclasses.replace(cfg, cross_request_bytes=int(args.cross_request_mib * (1 << 20)))
    engine = load_engine(cfg)
    app = None
    try:
        if engine.draft is None:
            for p in settings.profiles.values():
                if p.spec.get("mode") == "draft":
                    raise CliError(f"profile {p.name} uses spec=draft but there is no draft model (-md)", 2)
        if args.host not in ("127.0.0.1", "localhost", "::1") and not settings.api_key:
            log.warning("listening on %s without --api-key: anyone who can reach it can use it", args.host)
        app = create_app(engine, settings)
        config = uvicorn.Config(app, host=args.host, port=args.port, log_config=None, access_log=False,
                                lifespan="on", timeout_keep_alive=5)
        _server_class()(config, app.state.server.scheduler).run()  # a failed bind exits with status 1
    finally:
        if app is not None:
            app.state.server.scheduler.close()  # the engine thread must stop before the models are freed
        engine.close()
    return 0
