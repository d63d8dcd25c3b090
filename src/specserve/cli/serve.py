"""`specserve serve`: the OpenAI-compatible HTTP server.

Loads the models once, then serves until SIGTERM/SIGINT. The first signal drains:
requests in flight finish (for at most --drain-timeout seconds), new ones get 503,
then the process exits 0. A second signal ends the drain at once.
"""
from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import logging
import os
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import ModelConfig
from .common import CliError, add_model_args, add_spec_args, load_engine, model_config, spec_params
from .fitting import add_fit_args, fitted
from .router import add_router_args, wants_router
from .llama_flags import add_llama_args, aliases, chat_template, default_sampling, llama_overrides, template_kwargs

if TYPE_CHECKING:
    from ..server import ServerSettings

log = logging.getLogger("specserve.server")
API_KEY_ENV = "SPECSERVE_API_KEY"
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve OpenAI-compatible completions with speculative decoding",
                       description="Serve /v1/completions, /v1/chat/completions, /v1/models, /completion "
                                   "(llama-server), /health, /metrics and a chat page at /. Without -m, the "
                                   "packaged default pair is served. With --models-dir or --models-from: router "
                                   "mode, every model discovered, each loaded when asked for in a process of its "
                                   "own (see the router group below).")
    add_model_args(p)
    add_fit_args(p.add_argument_group("GPU fit"))
    add_spec_args(p)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1); several, "
                   "comma-separated, are each listened on")
    g.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    g.add_argument("--api-key", metavar="KEY", default=os.environ.get(API_KEY_ENV),
                   help=f"require 'Authorization: Bearer KEY' or 'X-Api-Key: KEY' (not on /health); default: "
                        f"${API_KEY_ENV}, which, unlike the command line, other users cannot see in ps")
    g.add_argument("--api-key-file", metavar="FILE",
                   help="read keys from FILE, one per line ('#' starts a comment); any of them is accepted. A line "
                        "'KEY scope=NAME' confines that key's requests to cross-request scope NAME, whatever "
                        "their profile or speculative.cross_request_scope says (one asking for another gets 400): "
                        "tenants with keys of their own scopes never draft from each other's text")
    g.add_argument("-a", "--alias", metavar="NAME", help="the served model's name (default: the target file's stem); "
                   "several comma-separated names are all served, the first in sorted order named in answers")
    g.add_argument("--profile", action="append", default=[], metavar="NAME=OPTIONS",
                   help="a named preset requests select with 'model': e.g. code=spec=draft,draft_max=8 or "
                        "prose=spec=none,temperature=0.8 (repeatable). Options: spec, draft_max, draft_min, "
                        "draft_p_min, ngram_min, ngram_max, suffix_max, cross_request, cross_request_scope, "
                        "temperature, top_k, top_p, min_p, seed, max_tokens, ignore_eos, verify; "
                        "pinned=OPT+OPT... lists options a request may not change (it gets 400 pinned_parameter "
                        "unless it sends the profile's own value). A profile's cross_request_scope is pinned "
                        "without being listed. Any key may name any profile: keep tenants apart with scoped "
                        "keys (--api-key-file)")
    g.add_argument("-np", "--parallel", type=int, default=2, metavar="N",
                   help="slots: requests generating at once, each step's tokens of all of them in one "
                        "forward pass (default 2)")
    g.add_argument("-b", "--batch-size", type=int, default=512, metavar="N",
                   help="most tokens in one forward pass: every slot's verification, then chunks of prompts "
                        "being processed, so that a long prompt does not stall the other streams (default 512; "
                        "llama.cpp computes them -ub at a time)")
    g.add_argument("--prefill-slowdown", type=float, default=2.0, metavar="F",  # server.core.batcher.SLOWDOWN
                   help="while streams are generating, a prompt being processed beside them takes only as many "
                        "tokens a pass as keep each pass within F x what the streams' tokens alone cost, so they "
                        "slow by about F at most (default %(default)s; 0: whole --batch-size chunks, the fastest "
                        "prompt processing)")
    g.add_argument("--prefill-stall", type=float, default=2.0, metavar="S",  # server.core.batcher.STALL
                   help="...or S seconds a pass, whichever is more: a short prompt joins the streams within a "
                        "pass or two instead of crawling beside them, a long one is still spread (default "
                        "%(default)s; 0: F alone bounds it)")
    g.add_argument("--cache-reuse", type=int, default=0, metavar="N",
                   help="as llama-server's: after the common prefix, keep runs of >= N cached tokens that moved to "
                        "earlier positions in the new prompt (an editor's window shifted by an edit above the cursor), "
                        "shifting their positions instead of evaluating them again; target and draft model. The kept "
                        "keys and values were computed after other text, so output can differ from a cold prompt's "
                        "(default 0: off, only the common prefix is reused; docs/infill.md)")
    g.add_argument("--queue", type=int, default=16, metavar="N",
                   help="requests waiting for a slot before new ones get 503 (default 16)")
    g.add_argument("--max-body-mib", type=float, default=4.0, metavar="MIB",
                   help="largest request body; bigger ones get 413 (default 4)")
    g.add_argument("--no-webui", action="store_true",
                   help="no chat page at / (it answers 404), as llama-server's flag (docs/webui.md)")
    g.add_argument("--reasoning-format", choices=("none", "deepseek", "auto"), default="auto",
                   help="as llama-server's: a reasoning model's <think> block in a chat's answer is parted from it "
                        "(reasoning_content) with deepseek; auto (default): the same, with the markers the chat "
                        "template spells; none: the raw text. A request's reasoning_format overrides it")
    g.add_argument("--sleep-idle-seconds", type=float, default=-1, metavar="S",
                   help="as llama-server's: after S seconds without a request, free the models and the slots' caches "
                        "(the auto profile and the cross-request store stay in memory); the next request that needs "
                        "the model loads them again, then is served, and requests arriving meanwhile wait. /health, "
                        "/props (is_sleeping), /metrics, /slots and /v1/models answer without waking it (default -1: "
                        "never)")
    g.add_argument("--reasoning-budget", type=int, default=-1, metavar="N",
                   help="as llama-server's: a chat's reasoning block is closed after N tokens (its close tag forced, "
                        "then the answer); -1 (default): unlimited, 0: closed at once. Per request: reasoning_budget")
    g = p.add_argument_group("connections and browsers")
    g.add_argument("--read-timeout", type=float, default=30.0, metavar="S",
                   help="seconds a client has to send a request's headers (else the connection is closed), "
                        "then again its body (else 408) (default 30)")
    g.add_argument("--request-line-timeout", type=float, default=10.0, metavar="S",
                   help="seconds a connection may stay open without sending a full request line, from its opening "
                        "or its previous answer; then it is closed (default 10)")
    g.add_argument("--max-connections", type=int, default=256, metavar="N",
                   help="connections served at once; requests on more get 503, except /health, which is always "
                        "answered (default 256)")
    g.add_argument("--max-connections-per-client", type=int, default=32, metavar="N",
                   help="open connections from one client address (loopback included); one more may ask for "
                        "/health, anything else gets 503 and it is closed (default 32; 0: no limit). Behind a "
                        "reverse proxy every client has the proxy's address: name it with --trusted-proxy")
    g.add_argument("--trusted-proxy", action="append", default=[], metavar="ADDR",
                   help="a reverse proxy's address or network (repeatable): its connections are not limited per "
                        "client; each request on them counts, as requests in flight, against the client its "
                        "X-Forwarded-For names (the rightmost address that is not a trusted proxy)")
    g.add_argument("--drain-timeout", type=float, default=20.0, metavar="S",
                   help="on SIGTERM, seconds the requests in flight may take to finish before streams end with "
                        "an error event and queued requests get 503 (default 20)")
    g.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="a host name clients may reach the server by, besides IP addresses, localhost and "
                        "--host (repeatable; '*' allows any: turns off the DNS-rebinding check)")
    g.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="a web origin (e.g. http://localhost:3000) whose pages may call the server; off by "
                        "default (repeatable; '*' allows any)")
    x = p.add_argument_group("cross-request drafting (the suffix drafter)")
    x.add_argument("--no-cross-request", action="store_true",
                   help="keep no store of earlier requests: the suffix drafter sees only the current request")
    x.add_argument("--cross-request-mib", type=float, default=64.0, metavar="MIB",
                   help="memory for earlier requests' prompt tails and outputs, oldest evicted first "
                        "(default 64: about 1.3M tokens)")
    r = p.add_argument_group("replicas on Ray Serve (pip install 'specserve[ray]'; see docs/scaling.md)")
    r.add_argument("--replicas", type=int, default=None, metavar="N",
                   help="run N engines (target, draft, slots, cross-request store each) as Ray Serve replicas "
                        "behind this one endpoint, routed by prompt prefix; -t and -np are per replica "
                        "(-t default: this machine's cores / N). With $RAY_ADDRESS: on that Ray cluster")
    r.add_argument("--min-replicas", type=int, default=None, metavar="N",
                   help="autoscale: fewest replicas (setting this or --max-replicas turns autoscaling on)")
    r.add_argument("--max-replicas", type=int, default=None, metavar="N", help="autoscale: most replicas")
    r.add_argument("--target-ongoing", type=float, default=None, metavar="R",
                   help="autoscale: requests in flight per replica to aim for (default: -np, its slots)")
    r.add_argument("--upscale-delay", type=float, default=30.0, metavar="S",
                   help="autoscale: seconds of load above target before adding a replica (default 30)")
    r.add_argument("--downscale-delay", type=float, default=300.0, metavar="S",
                   help="autoscale: seconds of load below target before removing one (default 300)")
    add_llama_args(p)
    add_router_args(p)
    p.set_defaults(run=run, serve_parser=p)


def _model_name(given: str | None, target_path: str, pair: str = "qwen") -> str:
    """What clients call the served model without --alias: the packaged name (the --pair's target
    where -m is not given), else the file's stem."""
    from ..models import PAIRS

    if given is None:
        return PAIRS[pair][0]
    if not given.endswith(".gguf") and "/" not in given:
        return given  # a packaged model name, e.g. smollm2-f16
    return Path(target_path).stem


def _serve_argv(args) -> list[str]:
    """The command line after `serve` (main() keeps it as args.argv): a router passes most of it on."""
    argv = list(getattr(args, "argv", []))
    return argv[argv.index("serve") + 1:] if "serve" in argv else argv


def api_keys(args) -> tuple[tuple[str, ...], dict[str, str]]:
    """The keys from --api-key (or $SPECSERVE_API_KEY) and --api-key-file, and the scope each key of
    the file confines its requests to (a line `KEY scope=NAME`; a bare `KEY` is confined to none).
    Raises CliError(2)."""
    keys = [args.api_key] if args.api_key else []
    scopes: dict[str, str] = {}
    if args.api_key_file:
        try:
            lines = Path(args.api_key_file).read_text().splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise CliError(f"--api-key-file: {e}", 2) from None
        found = 0
        for n, line in enumerate(lines, 1):
            words = line.split()
            if not words or words[0].startswith("#"):
                continue
            key, options = words[0], words[1:]
            for option in options:  # never the key itself in a message: the log and a terminal may show it
                name, sep, value = option.partition("=")
                if name != "scope" or not sep or not value:
                    raise CliError(f"--api-key-file {args.api_key_file} line {n}: a line is 'KEY' or "
                                   "'KEY scope=NAME'", 2)
                if scopes.get(key, value) != value:
                    raise CliError(f"--api-key-file {args.api_key_file} line {n}: this key was given another "
                                   "scope before", 2)
                if len(value) > 128:
                    raise CliError(f"--api-key-file {args.api_key_file} line {n}: a scope is at most 128 "
                                   "characters", 2)
                scopes[key] = value
            keys.append(key)
            found += 1
        if not found:
            raise CliError(f"--api-key-file {args.api_key_file} holds no key", 2)
    if args.api_key == "" and not keys:
        log.warning("--api-key (or $%s) is empty: authentication is off", API_KEY_ENV)
    return tuple(dict.fromkeys(keys)), scopes


def allowed_hosts(bind: str, extra: list[str]) -> frozenset[str]:
    """Host names the server answers to besides IP addresses and localhost: the bound name and --allowed-host."""
    names = {h.strip().lower().rstrip(".") for h in extra if h.strip()}
    for address in filter(None, (b.strip().strip("[]") for b in bind.split(","))):  # --host A,B: each
        try:
            ipaddress.ip_address(address)
        except ValueError:
            names.add(address.lower())
    return frozenset(names)


def settings_from(args, target_path: str):
    """ServerSettings from the flags; raises CliError(2) on bad values, before any model loads."""
    from ..server import ServerSettings
    from ..server.core.model_presets import Profile, build_profiles
    from ..server.state import MIN_BATCH

    n_batch = args.batch_size
    if 0 < n_batch < MIN_BATCH:  # llama-server takes any; a pass here must hold the longest verification
        log.warning("-b %d raised to %d: a pass holds the last token and a draft of up to 64", n_batch, MIN_BATCH)
        n_batch = MIN_BATCH
    if args.parallel < 1:
        raise CliError(f"--parallel must be >= 1, got {args.parallel}", 2)
    if args.queue < 0:
        raise CliError(f"--queue must be >= 0, got {args.queue}", 2)
    if not 0 <= args.port <= 65535:
        raise CliError(f"--port must be in [0, 65535], got {args.port}", 2)
    if not args.cross_request_mib > 0:
        raise CliError(f"--cross-request-mib must be > 0, got {args.cross_request_mib}", 2)
    names = aliases(args.alias)
    name = names[0] if names else _model_name(args.model, target_path, getattr(args, "pair", "qwen"))
    spec = {k: v for k, v in dataclasses.asdict(spec_params(args)).items() if k != "trace"}  # per request only
    keys, key_scopes = api_keys(args)
    try:
        profiles = build_profiles(Profile(name, spec=spec, sampling=default_sampling(args), verify=args.verify),
                                  args.profile)
        return ServerSettings(model_name=name, profiles=profiles, parallel=args.parallel, queue=args.queue,
                              n_batch=n_batch, prefill_slowdown=args.prefill_slowdown,
                              prefill_stall=args.prefill_stall,
                              api_keys=keys, key_scopes=key_scopes, max_body=int(args.max_body_mib * (1 << 20)),
                              allowed_hosts=allowed_hosts(args.host, args.allowed_host),
                              cors_origins=frozenset(o.strip().rstrip("/") for o in args.cors_origin if o.strip()),
                              read_timeout=args.read_timeout, drain_timeout=args.drain_timeout,
                              max_connections=args.max_connections,
                              max_connections_per_client=args.max_connections_per_client,
                              trusted_proxies=tuple(args.trusted_proxy),
                              request_line_timeout=args.request_line_timeout, webui=not args.no_webui,
                              aliases=names[1:],
                              tags=tuple(t.strip() for t in (args.tags or "").split(",") if t.strip()),
                              slots_endpoint=args.slots, verbose=args.verbose,
                              gcp_predict=os.environ.get("AIP_MODE") == "PREDICTION",
                              template_kwargs=template_kwargs(args),
                              reasoning_format=args.reasoning_format, reasoning_budget=args.reasoning_budget,
                              sleep_idle_seconds=args.sleep_idle_seconds)
    except ValueError as e:
        raise CliError(str(e), 2) from None


def configs(args) -> tuple[ModelConfig, ServerSettings]:
    """What one engine loads and how it serves, from the flags; raises CliError before any model loads."""
    llama_overrides(args)
    cfg = model_config(args)
    settings = settings_from(args, cfg.target_path)  # checks -np before --fit counts its slots
    cfg = fitted(cfg, args, n_seq=args.parallel)
    if args.cache_reuse < 0:
        raise CliError(f"--cache-reuse must be >= 0, got {args.cache_reuse}", 2)
    cfg = dataclasses.replace(cfg, cache_reuse=args.cache_reuse)
    if not args.no_cross_request:
        cfg = dataclasses.replace(cfg, cross_request_bytes=int(args.cross_request_mib * (1 << 20)))
    return cfg, settings


def _replicas(args):
    """cli/replicas.py, imported only when replicas are asked for: it needs the `ray` extra."""
    if args.sleep_idle_seconds != -1:
        raise CliError("--sleep-idle-seconds is for one server; replicas scale down instead (--min-replicas)", 2)
    try:
        from . import replicas
    except ImportError as e:
        raise CliError(f"--replicas needs Ray Serve: pip install 'specserve[ray]' ({e})", 2) from None
    return replicas


def app_builder(args: dict):
    """`serve run specserve.cli.serve:app_builder flags="..."`: Ray Serve's own runner, with the flags of
    `specserve serve --replicas N` (--host/--port are Serve's own there: `serve run --port`)."""
    p = argparse.ArgumentParser(prog="specserve serve")
    add_parser(p.add_subparsers(dest="command", required=True))
    ns = p.parse_args(["serve", *shlex.split(args.get("flags", ""))])
    return _replicas(ns).application(ns, *configs(ns))


def run(args) -> int:
    if wants_router(args):
        from . import router

        return router.run(args, _serve_argv(args), args.serve_parser, settings_from(args, "router"))
    if args.replicas is not None or args.min_replicas is not None or args.max_replicas is not None:
        replicas = _replicas(args)
        if args.threads is None:  # local replicas share the cores; on a cluster, set -t per replica yourself
            args.threads = max(1, (os.cpu_count() or 1) // max(1, args.replicas or 1))
        return replicas.run(args, *configs(args))
    from ..server import create_app, logsafe, server_of
    from ..server.http.listener import serve

    logsafe.install()  # clients' strings reach log lines: escape them
    cfg, settings = configs(args)
    template = chat_template(args)
    engine = load_engine(cfg)
    engine.draft_choice = getattr(args, "draft_choice", None)
    if template is not None:  # the chat template every chat is rendered with (and its tools read by)
        engine.target.metadata["tokenizer.chat_template"] = template
    app = None
    try:
        if engine.draft is None:
            for p in settings.profiles.values():
                if p.spec.get("mode") == "draft":
                    raise CliError(f"profile {p.name} uses spec=draft but there is no draft model (-md)", 2)
        if any(h.strip().strip("[]") not in _LOOPBACK for h in args.host.split(",")) and not settings.api_keys:
            log.warning("listening on %s without --api-key: anyone who can reach it can use it", args.host)
        app = create_app(engine, settings)
        serve(app, args.host, args.port, settings)
    finally:
        if app is not None:
            server_of(app).scheduler.close()  # the engine thread must stop before the models are freed
            server_of(app).close_embedder()
        engine.close()
    return 0
