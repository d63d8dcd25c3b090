"""`specserve bench`: which speculative configuration is fastest for these models on these prompts?

Runs the target alone and every configuration (each draft model and n-gram lookup at
each --draft-max, auto at the largest) on the same prompts, interleaved, and ranks
them by speed after the prompt, with the speedup to the last token (prompt included)
beside. A progress bar goes to stderr, the tables and the recommendation to stdout;
--json and --plot write the full results.
"""
from __future__ import annotations

import json
import logging
import os
import resource
import sys

from ..config import DEFAULT_VERIFY, DRAFT_CTX_DEFAULT, DRAFT_CTX_MIN, VERIFY_METHODS
from .common import DRAFT_WORDS, CliError, add_draft_candidates_arg, add_model_args, auto_draft, check_offload, \
    draft_windows, gpu_layers

_SPECS = ("draft", "ngram", "suffix", "auto", "auto-fresh", "none")
_DEFAULT_SPECS = ("draft", "ngram", "suffix", "auto", "none")
_DEFAULT_WORKLOADS = ("code-edit", "spec-bench")


def _comma_list(kind, allowed=None):
    def parse(text: str) -> list:
        try:
            items = [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"expected a comma-separated list, got {text!r}") from None
        bad = [x for x in items if allowed is not None and x not in allowed]
        if not items or bad:
            raise ValueError(f"expected a comma-separated list of {', '.join(allowed)}, got {text!r}")
        return items
    parse.__name__ = "list"  # argparse names the type in its error message
    return parse


def add_parser(sub) -> None:
    from ..bench.runner import VIAS
    from ..bench.workloads import BUILTIN_WORKLOADS

    p = sub.add_parser("bench", help="benchmark speculative configurations against the target alone",
                       description="Run the target alone and every speculative configuration on the same prompts, "
                                   "interleaved after a warm-up; rank them by speed after the prompt (the speedup to "
                                   "the last token, prompt included, beside) and recommend one.")
    add_model_args(p, draft=False, ubatch=False)
    d = p.add_argument_group("draft models")
    d.add_argument("-md", "--model-draft", nargs="+", action="extend", default=[], metavar="DRAFT",
                   help="draft model(s), GGUF path or packaged name; several to compare them "
                        "(default with no -m: the --pair's draft); auto: the one -md auto chooses")
    add_draft_candidates_arg(d)
    d.add_argument("--drafts", choices=("auto",), default=None,
                   help="auto: every model -md auto finds pairable with the target (cheapest first), each measured "
                        "end to end (--spec draft unless --spec says otherwise); the fastest, where it beats the "
                        "target alone, is pinned for this target on this machine, and -md auto chooses it after")
    d.add_argument("-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft", dest="n_gpu_layers_draft", type=gpu_layers,
                   default=0, metavar="N", help="draft layers on the GPU (default 0; all)")
    d.add_argument("--draft-ctx", "-cd", type=_comma_list(int), default=[DRAFT_CTX_DEFAULT], metavar="LIST",
                   help=f"the draft models' cache windows (default {DRAFT_CTX_DEFAULT}; 0: the whole context); "
                        "several to compare them: each draft model runs at each, named DRAFT@ctxN")
    g = p.add_argument_group("what to run")
    g.add_argument("--spec", type=_comma_list(str, _SPECS), default=None, metavar="LIST",
                   help="drafters to try: draft,ngram,suffix,auto,auto-fresh (default: all that apply but "
                        "auto-fresh; suffix runs once, at its own cap of 64; auto-fresh runs each prompt as a new "
                        "process's first request, from the saved profile or, with --no-auto-profile, from "
                        "priors); the target alone always runs")
    g.add_argument("--draft-max", type=_comma_list(int), default=[1, 2, 4, 8], metavar="LIST",
                   help="draft lengths to try (default 1,2,4,8); auto runs at the largest")
    g.add_argument("--ngram-max", type=_comma_list(int), default=None, metavar="LIST",
                   help="prompt lookup's draft lengths, where they should differ from --draft-max")
    g.add_argument("--workload", nargs="+", action="extend", metavar="NAME|FILE.jsonl",
                   help=f"built-in ({', '.join(BUILTIN_WORKLOADS)}, fim-replay: editor completion through /infill, "
                        "docs/infill.md; agent-loop[:messages|:chat]: an agent's tool loop through /v1/messages and "
                        "/v1/chat/completions, docs/agents.md) or a JSONL file of "
                        "{prompt|messages, temperature, max_tokens, category}; NAME:twice sends each prompt, then "
                        "the same request again; NAME:again sends its prompts, then the other workloads', then its "
                        "own again; NAME@T sends them at temperature T (writing@0.8); long-file:N and long-chat:N "
                        "cut their source files to about N tokens "
                        "(default: code-edit spec-bench)")
    g.add_argument("--prompts-per-workload", type=int, default=10, metavar="P",
                   help="prompts per workload (default 10; multi-turn: requests, 4 a conversation; fim-replay: cut "
                        "points, 3 requests each; agent-loop: conversations, 3 turns each, at most 10)")
    g.add_argument("--temp", type=float, nargs="+", default=None, metavar="T",
                   help="temperature(s); each runs everything (default: the workload's own, else 0)")
    g.add_argument("-n", "--n-predict", type=int, default=None, metavar="N",
                   help="tokens to generate per prompt (default: the workload's own, else 128)")
    g.add_argument("--repeat", type=int, default=1, metavar="R",
                   help="runs of each prompt per configuration (default 1)")
    g.add_argument("--seed", type=int, default=0, metavar="S", help="base of the per-prompt seeds (default 0)")
    g.add_argument("--ignore-eos", action="store_true", help="always generate N tokens")
    g.add_argument("--verify", choices=VERIFY_METHODS, default=DEFAULT_VERIFY,
                   help="sampled verification (default auto: gumbel, as the bench seeds every prompt); rejection "
                        "measures what a request without a seed gets under auto: more of a draft model's tokens "
                        "kept, a different text for a seed in each configuration")
    g.add_argument("--no-auto-profile", action="store_true",
                   help="auto starts from its priors (a fresh process's first requests) and keeps nothing; by "
                        "default it starts from, and adds to, what it learnt on these models before")
    g.add_argument("--via", type=_comma_list(str, VIAS), default=["server"], metavar="LIST",
                   help="how the configurations run: server (default: every request through a `specserve serve` "
                        "of the bench's own on a loopback port, as users meet it), inprocess (this process's "
                        "engine, named '(in-process)' beside served ones), or server,inprocess for both side by "
                        "side; auto-fresh runs in-process only")
    g.add_argument("-np", "--parallel", type=int, default=2, metavar="N",
                   help="slots of the bench's own server (default 2, as `specserve serve`)")
    g.add_argument("--endpoint", nargs="+", action="extend", default=[], metavar="URL",
                   help="also run the prompts against OpenAI-compatible server(s), as URL or NAME=URL, e.g. "
                        "llama-ngram=http://127.0.0.1:8081")
    g.add_argument("--endpoint-baseline", nargs="+", metavar="NAME|URL|NAME=BASE",
                   help="one of the --endpoint servers that runs its target alone: the endpoints' speedups are "
                        "paired against it (each server against its own target alone) instead of specserve's; "
                        "NAME=BASE pairs one endpoint against another (two servers' endpoints in one run)")
    g.add_argument("--endpoint-api-key", metavar="KEY", help="API key sent to the endpoints")
    g.add_argument("--clients", type=_comma_list(int), default=None, metavar="LIST",
                   help="load: N clients at once for each N (e.g. 1,4,8), each sending its own --requests-per-client "
                        "prompts of the workloads in turn (default code-edit coding writing@0.8), every request a "
                        "streamed /completion; aggregate tok/s per configuration and client count, each beside its "
                        "own no-speculation rate run next to it (specserve's: the same server with speculation off; "
                        "an endpoint's: its --endpoint-baseline), per-request decode rate, time to first token and "
                        "queue time (p50, p95). Through servers only; -np sets the bench's own server's slots; --spec "
                        "defaults to auto; docs/serving-speed.md")
    g.add_argument("--requests-per-client", type=int, default=3, metavar="R",
                   help="with --clients: requests each client sends, one after another (default 3)")
    g.add_argument("--server-log", metavar="DIR",
                   help="keep the log of each of the bench's own servers in DIR (serve-DRAFT.log, created if "
                        "missing); with SPECSERVE_LOG=debug it holds a line for each auto step: what was planned, "
                        "what ran, and why (docs/auto.md)")
    g.add_argument("--auto-profile-from", metavar="empty|FILE",
                   help="the bench's own servers start --spec auto from this saved auto profile (a copy: the "
                        "user's own is neither read nor changed), or from none (empty), learning as they run")
    out = p.add_argument_group("output")
    out.add_argument("--json", metavar="OUT", help="write the full results as JSON")
    out.add_argument("--plot", metavar="OUT.png", help="write speedup vs draft length and acceptance by position")
    out.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=run)


def _validate(args) -> None:
    checks = [(args.ctx_size >= 16, f"context size must be >= 16, got {args.ctx_size}"),
              (args.prompts_per_workload > 0, "--prompts-per-workload must be > 0"),
              (args.repeat > 0, "--repeat must be > 0"),
              (args.parallel > 0, "-np must be > 0"),
              (args.requests_per_client > 0, "--requests-per-client must be > 0"),
              (all(n > 0 for n in args.clients or []), "--clients values must be > 0"),
              (not (args.auto_profile_from and args.no_auto_profile),
               "--auto-profile-from and --no-auto-profile contradict each other"),
              (args.n_predict is None or args.n_predict > 0, "-n must be > 0"),
              (all(1 <= k <= 64 for k in args.draft_max + (args.ngram_max or [])),
               "--draft-max and --ngram-max values must be in [1, 64]"),
              (all(t >= 0 for t in args.temp or []), "--temp values must be >= 0"),
              (all(w == 0 or w >= DRAFT_CTX_MIN for w in args.draft_ctx),
               f"--draft-ctx values must be 0 (the whole context) or >= {DRAFT_CTX_MIN}")]
    for ok, message in checks:
        if not ok:
            raise CliError(message, 2)


def _model_paths(args) -> tuple[str, dict[str, str]]:
    """The target's path and {draft as named: path}."""
    from .. import models

    try:
        if args.model is None:
            pair_target, pair_draft = models.PAIRS[args.pair]
            target = models.ensure(pair_target)
            drafts = args.model_draft or [pair_draft]
        else:
            target, drafts = models.resolve(args.model), args.model_draft
        drafts = _auto_drafts(args, str(target), drafts)
        paths = {d: str(models.resolve(d)) for d in dict.fromkeys(drafts)}
    except (FileNotFoundError, LookupError, RuntimeError, ValueError) as e:
        raise CliError(str(e)) from None
    if len(args.draft_ctx) > 1:  # each draft model at each window: a draft of its own for the bench
        paths = {f"{d}@ctx{w}": p for d, p in paths.items() for w in dict.fromkeys(args.draft_ctx)}
    return str(target), paths


def _auto_drafts(args, target: str, drafts: list[str]) -> list[str]:
    """-md auto: the draft draft_choice.py chooses for the target (printed with its reason); none: dropped."""
    from .. import models

    if not any(d in DRAFT_WORDS for d in drafts):
        return drafts
    out = [d for d in drafts if d not in DRAFT_WORDS]
    if "auto" in drafts:
        choice = auto_draft(args, target)
        print("\n".join(choice.lines()), file=sys.stderr)
        if choice.chosen is not None:  # named as the user would name it: a packaged name, else its path
            packaged = any(m.name == choice.chosen.name for m in models.MODELS)
            out.append(choice.chosen.name if packaged else choice.draft_path)
    return out


def _candidates(args, target: str, given: dict[str, str]) -> dict[str, str]:
    """--drafts auto: {name: path} of every pairable candidate, cheapest first, then any -md given beside."""
    choice = auto_draft(args, target)
    print("\n".join(choice.lines()), file=sys.stderr)
    if not choice.ranked:
        raise CliError(f"--drafts auto: {choice.reason.removeprefix('none: ')}", 2)
    found = {c.name: c.path for c in choice.ranked}
    if not args.model_draft:  # the --pair's draft _model_paths put there: not asked for
        return found
    return {**found, **{k: p for k, p in given.items() if p not in found.values()}}


def _pin(args, target: str, draft_paths: dict[str, str], entries: list[dict]) -> None:
    """--drafts auto: pin the fastest draft for the target (draft_pins.py), or say why none is."""
    from .. import draft_pins
    from ..bench.report import ALL

    best, speedups = draft_pins.winner(entries, ALL)
    measured = ", ".join(f"{name} {x:.2f}x" for name, x in sorted(speedups.items(), key=lambda kv: -kv[1]))
    if best is None:
        print(f"drafts: none beat the target alone ({measured}): nothing pinned", file=sys.stderr)
        return
    try:
        where = draft_pins.pin(target, draft_paths[best], args.threads or max(1, os.cpu_count() or 1), speedups)
    except OSError as e:
        raise CliError(f"--drafts auto: cannot write the pin: {e}") from None
    print(f"drafts: pinned {best} for {os.path.basename(target)} (speedups over the target alone: {measured}); "
          f"-md auto chooses it from now on ({where})", file=sys.stderr)


def _load(args, target_path: str, draft_paths: dict[str, str]):
    from ..backends import load_model
    from ..bench import LocalModels
    from ..pairing import check_pairing

    loaded = []
    try:
        target = load_model(target_path, args.n_gpu_layers, args.threads, exact=args.exact)
        loaded.append(target)
        drafts, by_path = {}, {}
        for name, path in draft_paths.items():
            if path in by_path:  # the same model at another window
                drafts[name] = by_path[path]
                continue
            drafts[name] = by_path[path] = load_model(path, args.n_gpu_layers_draft, args.threads, flag="-ngld")
            loaded.append(drafts[name])
            report = check_pairing(target, drafts[name])
            if report.flagrant:
                raise CliError(f"draft model {name} refused: " + "; ".join(report.problems), 2)
            for w in report.warnings:
                print(f"warning: {name}: {w}", file=sys.stderr)
        return LocalModels(target, drafts, args.ctx_size, auto_profile=not args.no_auto_profile,
                           windows=draft_windows(args, draft_paths)), loaded
    except (FileNotFoundError, ValueError, MemoryError) as e:
        for m in loaded:
            m.close()
        raise CliError(str(e)) from None
    except CliError:
        for m in loaded:
            m.close()
        raise


def run(args) -> int:
    from ..bench import BenchPlan, load_workload, plan_configs, recommend, run_benchmark, summarize, summarize_turns
    from ..bench.endpoint import EndpointClient, EndpointError
    from ..bench.served import ServerFailed
    from ..bench.report import machine_info, path_ratios
    from ..bench.table import render

    _validate(args)
    check_offload(args)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per endpoint request otherwise
    try:
        workloads = args.workload or _DEFAULT_WORKLOADS
        prompts = [p for w in workloads if w != "fim-replay" and not w.startswith("agent-loop")
                   for p in load_workload(w, args.prompts_per_workload)]
    except ValueError as e:
        raise CliError(str(e), 2) from None
    target_path, draft_paths = _model_paths(args)
    if args.drafts == "auto":
        draft_paths = _candidates(args, target_path, draft_paths)
    if args.spec is not None and "draft" in args.spec and not draft_paths:
        raise CliError("--spec draft needs a draft model (-md)", 2)
    if args.clients:  # load: N clients at once, each configuration beside its own baseline (bench_clients.py)
        from . import bench_clients
        return bench_clients.run(args, target_path, draft_paths, args.spec or list(bench_clients.DEFAULT_SPECS),
                                 _serve)
    specs = args.spec or (["draft"] if args.drafts == "auto" else list(_DEFAULT_SPECS))
    if "fim-replay" in workloads:  # editor completion through /infill: a run of its own (bench_fim.py)
        from . import bench_fim
        return bench_fim.run(args, target_path, draft_paths, specs)
    if any(w.startswith("agent-loop") for w in workloads):  # an agent's tool loop through its APIs (bench_agent.py)
        from . import bench_agent
        return bench_agent.run(args, target_path, draft_paths, specs)
    try:
        configs = plan_configs(specs, list(draft_paths), args.draft_max, args.endpoint, args.ngram_max,
                               tuple(args.via), args.endpoint_baseline)
    except ValueError as e:
        raise CliError(str(e), 2) from None
    local, loaded = _load(args, target_path, draft_paths)
    endpoints = {url: EndpointClient(url, api_key=args.endpoint_api_key)
                 for url in dict.fromkeys(c.endpoint for c in configs if c.endpoint)}
    served = None
    try:
        if "server" in args.via:
            served = _serve(args, target_path, draft_paths)
        for client in endpoints.values():
            client.probe()
        plan = BenchPlan(configs, prompts, args.temp, args.n_predict, args.repeat, args.seed, args.ignore_eos,
                         args.verify)
        fitting = [p for p in prompts if local.fits(p, plan.sampling(0.0, p).max_tokens)]
        if len(fitting) < len(prompts):
            print(f"warning: {len(prompts) - len(fitting)} prompt(s) do not fit the context of {args.ctx_size} "
                  "tokens with their output; skipped (raise -c)", file=sys.stderr)
        if not fitting:
            raise CliError("no prompt fits the context", 2)
        plan = BenchPlan(configs, fitting, args.temp, args.n_predict, args.repeat, args.seed, args.ignore_eos,
                         args.verify)
        results = run_benchmark(plan, local, endpoints, progress=False if args.no_progress else None, served=served)
        memory = {**local.memory(), "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    except (EndpointError, ServerFailed) as e:
        raise CliError(str(e)) from None
    finally:
        if served is not None:
            served.close()
        for client in endpoints.values():
            client.close()
        local.close()
        for m in loaded:
            m.close()
    entries = summarize(configs, results, memory)
    if args.drafts == "auto":
        _pin(args, target_path, draft_paths, entries)
    recommendation = recommend(configs, results, entries)
    turns = summarize_turns(configs, results)
    paths = path_ratios(configs, results)
    if args.json:  # first: an hour of measurements must survive a failure below
        settings = {"target": args.model or target_path, "drafts": list(draft_paths), "spec": specs,
                    "draft_max": args.draft_max, "workloads": list(dict.fromkeys(p.workload for p in fitting)),
                    "n_prompts": len(fitting), "temperatures": args.temp, "n_predict": args.n_predict,
                    "repeat": args.repeat, "seed": args.seed, "ignore_eos": args.ignore_eos, "verify": args.verify,
                    "n_ctx": args.ctx_size, "endpoints": args.endpoint, "via": args.via,
                    "server_parallel": args.parallel if "server" in args.via else None}
        report = {"configs": entries, "turns": turns, "paths": paths, "recommendation": recommendation,
                  "memory": memory, "machine": machine_info(args.threads), "settings": settings,
                  "runs": [vars(m) for m in results]}
        _write(args.json, lambda f: (json.dump(report, f, indent=1), f.write("\n")))
    if "server" in args.via:
        print(f"through `specserve serve -np {args.parallel}` of the bench's own (streamed /v1/completions); "
              + ("configurations marked (in-process) ran in this process" if any(c.via == "inprocess" for c in configs)
                 else "nothing ran in-process") + "\n")
    print(render(entries, recommendation, memory, turns, paths))
    if args.plot:
        from ..bench.plot import write_plot

        try:
            write_plot(entries, args.plot)
        except OSError as e:
            raise CliError(f"cannot write {args.plot}: {e}") from None
    return 0


def _serve(args, target_path: str, draft_paths: dict[str, str]):
    """The bench's own servers, started with its models, context and threads (minutes for a big target)."""
    from ..bench.served import ServedModels, log_name

    print(f"starting specserve serve -np {args.parallel} for the served configurations ...", file=sys.stderr)
    if args.server_log:
        try:
            os.makedirs(args.server_log, exist_ok=True)
        except OSError as e:
            raise CliError(f"--server-log: cannot make {args.server_log}: {e.strerror}") from None
        names = ", ".join(log_name(d) for d in (draft_paths or {None: None}))
        print(f"keeping the servers' logs in {args.server_log} ({names})", file=sys.stderr)
    return ServedModels(target_path, draft_paths, args.ctx_size, args.threads, args.parallel,
                        auto_profile=not args.no_auto_profile, windows=draft_windows(args, draft_paths),
                        n_gpu_layers=(args.n_gpu_layers, args.n_gpu_layers_draft), exact=args.exact,
                        home=_profile_home(args, target_path, draft_paths), log_dir=args.server_log)


def _profile_home(args, target_path: str, draft_paths: dict[str, str]):
    """--auto-profile-from: a directory holding the given profile under each server's key (bench/profiles.py)."""
    if not args.auto_profile_from:
        return None
    from ..bench.profiles import ProfileHome

    try:
        return ProfileHome(args.auto_profile_from, target_path, [None, *draft_paths.values()],
                           args.threads or max(1, os.cpu_count() or 1))
    except (OSError, ValueError) as e:
        raise CliError(str(e), 2) from None


def _write(path: str, write) -> None:
    try:
        with open(path, "w", encoding="utf-8") as f:
            write(f)
    except OSError as e:
        raise CliError(f"cannot write {path}: {e}") from None
