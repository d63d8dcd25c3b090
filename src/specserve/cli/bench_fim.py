"""`specserve bench --workload fim-replay`: editor completion through /infill, per configuration.

Starts the bench's own `specserve serve` (one per draft model, as every served bench does), runs
the target alone and each drafter at the largest --draft-max (auto too) as /infill requests
replaying edits of standard-library files (bench/fim_workload.py), and any --endpoint (a
llama-server) on the same requests at its own /infill. Prints the table; --json writes it with
every request.
"""
from __future__ import annotations

import json
import logging
import sys

from .common import CliError, draft_windows

DEFAULT_N_PREDICT = 64


def run(args, target_path: str, draft_paths: dict[str, str], specs: list[str]) -> int:
    from ..bench.endpoint import EndpointError
    from ..bench.fim_replay import render_replay, run_replay, runs_json, summarize_replay
    from ..bench.fim_workload import FIM_MODULES, KEYSTROKES, N_PREFIX, N_SUFFIX, fim_replay
    from ..bench.report import machine_info
    from ..bench.runner import plan_configs
    from ..bench.served import ServedModels, ServerFailed

    if args.workload != ["fim-replay"]:
        raise CliError("fim-replay runs alone: give --workload fim-replay without other workloads", 2)
    if args.via != ["server"]:
        raise CliError("fim-replay runs through servers only (--via server, the default)", 2)
    if args.temp not in (None, [0.0]) or args.repeat != 1:
        raise CliError("fim-replay is greedy and runs once (--temp and --repeat do not apply)", 2)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    specs = [s for s in specs if s != "auto-fresh"]
    k = max(args.draft_max)
    try:
        files = fim_replay(args.prompts_per_workload)
        configs = [c for c in plan_configs(specs, list(draft_paths), [k], args.endpoint, None, ("server",),
                                           args.endpoint_baseline)]
    except ValueError as e:
        raise CliError(str(e), 2) from None
    n_predict = args.n_predict or DEFAULT_N_PREDICT
    print("starting specserve serve for the served configurations ...", file=sys.stderr)
    served = None
    try:
        served = ServedModels(target_path, draft_paths, args.ctx_size, args.threads, args.parallel,
                              auto_profile=not args.no_auto_profile, windows=draft_windows(args, draft_paths),
                              n_gpu_layers=(args.n_gpu_layers, args.n_gpu_layers_draft))
        urls = {c.name: c.endpoint if c.spec == "endpoint" else served.url(c.draft_model) for c in configs}
        runs = run_replay(configs, files, urls, n_predict, progress=not args.no_progress)
    except (EndpointError, ServerFailed) as e:
        raise CliError(str(e)) from None
    finally:
        if served is not None:
            served.close()
    rows = summarize_replay(configs, runs)
    n_requests = sum(map(len, files))
    head = (f"fim-replay: {n_requests} /infill requests per configuration ({args.prompts_per_workload} cut points, "
            f"{len(KEYSTROKES)} keystrokes each) editing {', '.join(m.replace('.', '/') + '.py' for m in FIM_MODULES)} "
            f"from this Python's standard library; greedy, n_predict {n_predict}, n_indent, {N_PREFIX} lines above "
            f"and {N_SUFFIX} below; through `specserve serve -np {args.parallel}` of the bench's own")
    if args.json:
        settings = {"target": args.model or target_path, "drafts": list(draft_paths), "spec": specs, "draft_max": k,
                    "n_cuts": args.prompts_per_workload, "n_predict": n_predict, "n_ctx": args.ctx_size,
                    "modules": list(FIM_MODULES), "keystrokes": list(KEYSTROKES), "endpoints": args.endpoint}
        try:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump({"workload": "fim-replay", "configs": rows, "settings": settings,
                           "machine": machine_info(args.threads), "runs": runs_json(runs)}, f, indent=1)
        except OSError as e:
            raise CliError(f"cannot write {args.json}: {e}") from None
    print(head + "\n")
    print(render_replay(rows))
    return 0
