"""`specserve serve --models-dir DIR` / `--models-from STORES`: the router (specserve/router/).

The router loads no model itself: it discovers them (stores.py), and runs each one asked for as a
`specserve serve` child with the router's own command line, less what the router owns (the address,
the keys, the models), as llama-server's router passes its arguments to its instances.
"""
from __future__ import annotations

import argparse
import logging
import secrets

from .common import CliError

log = logging.getLogger("specserve.router")
# what the router decides for itself, never passed on to a child
ROUTER_DESTS = {"models_dir", "models_from", "models_max", "no_models_autoload", "models_preset", "models_memory",
                "host", "port", "api_key", "api_key_file", "alias", "model", "model_draft", "pair", "allowed_host",
                "cors_origin", "max_connections", "max_connections_per_client", "trusted_proxy", "replicas",
                "min_replicas", "max_replicas", "target_ongoing", "upscale_delay", "downscale_delay"}


def add_router_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("router: several models, each loaded when asked for (as llama-server's router mode)")
    g.add_argument("--models-dir", metavar="DIR",
                   help="serve the GGUF models in DIR, each named by its file name without .gguf (a folder of "
                        "split parts, NAME-00001-of-0000N.gguf, is one model, named by the folder); each loaded "
                        "model runs as its own `specserve serve` process with this command's other flags, and "
                        "a request's `model` picks it on every API")
    g.add_argument("--models-from", metavar="STORES",
                   help="serve the models other tools keep, comma-separated: ollama ($OLLAMA_MODELS or "
                        "~/.ollama/models, named as Ollama names them: qwen2.5-coder:1.5b), lmstudio, hf (the "
                        "Hugging Face hub cache), llama.cpp ($LLAMA_CACHE or ~/.cache/llama.cpp), packaged "
                        "(specserve's own), or all")
    g.add_argument("--models-max", type=int, default=4, metavar="N",
                   help="most models loaded at once; loading one more first unloads the least recently used "
                        "(default 4)")
    g.add_argument("--no-models-autoload", action="store_true",
                   help="load a model only on POST /models/load {\"model\": NAME}, not on a request for it")
    g.add_argument("--models-memory", metavar="SIZE",
                   help="memory all loaded models may take together (e.g. 24GiB; auto: this machine's RAM), as "
                        "`specserve check` estimates each (weights, KV cache and compute per slot, the process): a "
                        "load first unloads the least recently used idle models until it fits; one that could "
                        "never fit is refused (422) with the numbers (default: no budget, --models-max alone)")
    g.add_argument("--models-preset", metavar="FILE",
                   help="llama-server's INI: a [NAME] section per model with its flags without dashes "
                        "(model-draft = PATH or none, ctx-size = 8192, load-on-startup = true), [*] for all; "
                        "a section for a model not discovered gives its model = PATH")


def wants_router(args) -> bool:
    return bool(args.models_dir or args.models_from or args.models_preset)


def _takes_value(parser: argparse.ArgumentParser):
    def takes(option: str) -> bool | None:
        action = parser._option_string_actions.get(option)
        return None if action is None else action.nargs != 0
    return takes


def child_argv(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """The router's `serve` arguments less the ones it owns (ROUTER_DESTS), for every child."""
    out, skip = [], False
    for token in argv:
        if skip:
            skip = False
            continue
        option, eq, _ = token.partition("=")
        action = parser._option_string_actions.get(option) if token.startswith("-") else None
        if action is not None and action.dest in ROUTER_DESTS:
            skip = not eq and action.nargs != 0
            continue
        out.append(token)
    return out


def _models(args, parser, argv: list[str]):
    from ..router.pool import Model
    from ..router.preset import read_preset
    from ..stores import Found, discover, from_file, parse_stores

    try:
        stores = parse_stores(args.models_from) if args.models_from else ()
        found = discover(args.models_dir, stores)
        presets, common_preset = read_preset(args.models_preset, _takes_value(parser)) if args.models_preset \
            else ({}, None)
    except ValueError as e:
        raise CliError(str(e), 2) from None
    by_name = {f.name: f for f in found}
    for name, preset in presets.items():
        if name not in by_name:
            if preset.model is None:
                raise CliError(f"--models-preset [{name}]: no discovered model has this name, and the section "
                               "gives no model = PATH", 2)
            by_name[name] = from_file(name, preset.model, "preset")
        elif preset.model is not None:
            by_name[name] = Found(name, preset.model, "preset", by_name[name].size)
    if not by_name:
        raise CliError("the router found no model (--models-dir, --models-from, --models-preset)", 2)
    if args.model_draft:
        log.warning("-md is not passed to the router's models: each gets -md auto (a draft chosen among the "
                    "discovered models), or its --models-preset section's model-draft = PATH | none")
    common = child_argv(argv, parser)
    servable = {n: f for n, f in by_name.items() if f.error is None and f.path is not None}
    models = []
    for name, f in by_name.items():
        preset = presets.get(name, common_preset)  # a model without a section of its own gets [*]'s
        names = [name, name.removesuffix(":latest")] if name.endswith(":latest") else [name]
        own = ["-m", str(f.path), "-a", ",".join(names), "--max-connections-per-client", "0"]
        if not (preset and preset.draft_given):  # -md auto among the discovered models, each by its name
            own += ["-md", "auto", *(x for n, c in servable.items() if n != name
                                     for x in ("--draft-candidates", f"{n}={c.path}"))]
        models.append(Model(f, own + (preset.args if preset else []) + common,
                            draft=preset.draft if preset else None))
    return models, [n for n, p in presets.items() if p.load_on_startup]


def _budget(text: str | None) -> int | None:
    from ..memory import parse_bytes, physical_memory

    if text is None:
        return None
    if text.strip().lower() == "auto":
        found = physical_memory()
        if found is None:
            raise CliError("--models-memory auto: this system does not say how much memory it has; give a size", 2)
        return found
    try:
        return parse_bytes(text)
    except ValueError as e:
        raise CliError(f"--models-memory: {e}", 2) from None


def run(args, argv: list[str], parser: argparse.ArgumentParser, settings) -> int:
    """The router until a signal has drained it; `settings`: the server's, from the same flags."""
    from ..router.app import create_router_app
    from ..router.budget import child_memory
    from ..router.pool import Pool
    from ..server import logsafe
    from ..server.http.listener import serve

    if args.replicas is not None or args.min_replicas is not None or args.max_replicas is not None:
        raise CliError("the router runs each model as one process: --replicas is for one model", 2)
    if args.model:
        raise CliError("-m serves one model; the router (--models-dir, --models-from) serves the models it "
                       "discovers", 2)
    logsafe.install()
    models, at_start = _models(args, parser, argv)
    budget = _budget(args.models_memory)
    try:
        pool = Pool(models, secrets.token_urlsafe(24), args.models_max, not args.no_models_autoload,
                    stop_timeout=args.drain_timeout + 10, budget=budget,
                    estimate=lambda m: child_memory(m.args, parser))
    except ValueError as e:
        raise CliError(str(e), 2) from None
    for m in models:
        log.info("model %s (%s)%s", m.name, m.found.store, f": failed, {m.found.error}" if m.found.error else "")

    def rediscover():
        try:
            return _models(args, parser, argv)[0]
        except CliError as e:
            raise ValueError(str(e)) from None

    app = create_router_app(pool, settings, at_start, rediscover)
    serve(app, args.host, args.port, settings, drain=app.state.router.drain, on_error=app.state.router.on_error)
    return 0

