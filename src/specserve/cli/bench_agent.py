"""`specserve bench --workload agent-loop`: a coding agent's tool loop through the agents' own APIs.

Starts the bench's own `specserve serve` (one per draft model, as every served bench does), holds
each conversation of bench/agent_workload.py (read a file with a tool, write it back with a change,
then with another; every turn re-sends the whole conversation) through /v1/messages and
/v1/chat/completions (`agent-loop:messages` or `agent-loop:chat` for one of them), for the target
alone and each drafter at the largest --draft-max (auto too), and for any --endpoint (llama-server
serves both APIs). Prints time to first token and decode speed per turn; --json writes every request.
"""
from __future__ import annotations

import json
import logging
import sys

from .common import CliError

WORKLOAD = "agent-loop"


def apis_of(workloads: list[str]) -> tuple[str, ...]:
    """The APIs the agent-loop workload names: agent-loop (both), agent-loop:messages, agent-loop:chat."""
    from ..bench.agent_loop import APIS

    if len(workloads) != 1:
        raise CliError(f"{WORKLOAD} runs alone: give --workload {WORKLOAD}[:messages|:chat] without others", 2)
    name, _, api = workloads[0].partition(":")
    if name != WORKLOAD or api not in ("", *APIS):
        raise CliError(f"--workload {workloads[0]}: the agent loop is {WORKLOAD}, {WORKLOAD}:messages or "
                       f"{WORKLOAD}:chat", 2)
    return (api,) if api else APIS


def run(args, target_path: str, draft_paths: dict[str, str], specs: list[str]) -> int:
    from ..bench.agent_loop import MAX_TOKENS, render_loop, run_loop, runs_json, summarize_loop
    from ..bench.agent_workload import AGENT_MODULES, MAX_CHARS, TURNS, agent_tasks
    from ..bench.endpoint import EndpointError
    from ..bench.report import machine_info
    from ..bench.runner import plan_configs
    from ..bench.served import ServedModels, ServerFailed

    apis = apis_of(args.workload)
    if args.via != ["server"]:
        raise CliError(f"{WORKLOAD} runs through servers only (--via server, the default)", 2)
    if args.temp not in (None, [0.0]) or args.repeat != 1:
        raise CliError(f"{WORKLOAD} is greedy and runs once (--temp and --repeat do not apply)", 2)
    n_edit = args.n_predict or MAX_TOKENS["edit"]  # -n: the edit turns' max_tokens
    logging.getLogger("httpx").setLevel(logging.WARNING)
    specs = [s for s in specs if s != "auto-fresh"]
    k = max(args.draft_max)
    try:
        tasks = agent_tasks(min(args.prompts_per_workload, len(AGENT_MODULES)))
        configs = plan_configs(specs, list(draft_paths), [k], args.endpoint, None, ("server",), args.endpoint_baseline)
    except ValueError as e:
        raise CliError(str(e), 2) from None
    print("starting specserve serve for the served configurations ...", file=sys.stderr)
    served = None
    try:
        served = ServedModels(target_path, draft_paths, args.ctx_size, args.threads, args.parallel,
                              auto_profile=not args.no_auto_profile,
                              n_gpu_layers=(args.n_gpu_layers, args.n_gpu_layers_draft))
        urls = {c.name: c.endpoint if c.spec == "endpoint" else served.url(c.draft_model) for c in configs}
        runs = run_loop(configs, tasks, urls, apis, progress=not args.no_progress,
                        max_tokens={"edit": n_edit, "edit-2": n_edit})
    except (EndpointError, ServerFailed) as e:
        raise CliError(str(e)) from None
    finally:
        if served is not None:
            served.close()
    rows = summarize_loop(configs, runs)
    head = (f"{WORKLOAD}: {len(tasks)} conversations ({', '.join(t.path for t in tasks)}; excerpts of at most "
            f"{MAX_CHARS} characters from this Python's standard library), turns {', '.join(TURNS)} through "
            f"{' and '.join('/v1/' + ('messages' if a == 'messages' else 'chat/completions') for a in apis)}; "
            f"greedy, max_tokens {MAX_TOKENS['read']} (read) and {n_edit} (edits), the prompt cache on; "
            f"through `specserve serve -np {args.parallel}` of the bench's own")
    if args.json:
        settings = {"target": args.model or target_path, "drafts": list(draft_paths), "spec": specs, "draft_max": k,
                    "n_conversations": len(tasks), "apis": list(apis), "n_ctx": args.ctx_size,
                    "files": [t.path for t in tasks], "endpoints": args.endpoint, "max_tokens_edit": n_edit}
        try:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump({"workload": WORKLOAD, "configs": rows, "settings": settings,
                           "machine": machine_info(args.threads), "runs": runs_json(runs)}, f, indent=1)
        except OSError as e:
            raise CliError(f"cannot write {args.json}: {e}") from None
    print(head + "\n")
    print(render_loop(rows))
    return 0
