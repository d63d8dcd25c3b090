"""`specserve bench --clients 1,4,8`: the configurations under load, each beside its own no-speculation rate.

The runs and what is timed how: bench/clients.py; the rows and tables: bench/load_report.py. This module turns
the bench's flags into its plan: the prompts as token ids (the target's vocabulary alone is read, no weights),
each client's work, the bench's own `specserve serve` and any --endpoint servers as load targets, each paired
with its baseline.
"""
from __future__ import annotations

import json
import os
import sys

from ..config import SUFFIX_MAX_DEFAULT
from .common import CliError

DEFAULT_WORKLOADS = ("code-edit", "coding", "writing@0.8")  # issue 60's mixed work: edits, questions, stories
DEFAULT_SPECS = ("auto",)


def run(args, target_path: str, draft_paths: dict[str, str], specs: list[str], serve) -> int:
    """serve(args, target_path, draft_paths): the bench's own servers (bench.py's, with its flags)."""
    from ..bench.clients import LoadError, client_work, run_load
    from ..bench.load_report import render_load, summarize_load
    from ..bench.report import machine_info
    from ..bench.served import ServerFailed

    if "inprocess" in args.via:
        raise CliError("--clients runs through servers only (--via server, --endpoint)", 2)
    workloads = args.workload or list(DEFAULT_WORKLOADS)
    configs = _configs(args, specs, draft_paths)
    prompts, warm = _requests(args, target_path, workloads)
    work = {n: client_work(prompts, n, args.requests_per_client, args.seed) for n in args.clients}
    pairs = pair_up(configs)
    served = None
    try:
        if any(c.spec != "endpoint" for c in configs):
            served = serve(args, target_path, draft_paths)
        targets = {c.name: _target(args, c, served) for c in configs}
        progress = None if args.no_progress else (lambda text: print(text, file=sys.stderr, flush=True))
        runs = run_load(targets, pairs, args.clients, work, warm, progress)
    except (LoadError, ServerFailed) as e:
        raise CliError(str(e)) from None
    finally:
        if served is not None:
            served.close()
    rows = summarize_load(runs, pairs, args.clients)
    if args.json:
        settings = {"target": args.model or target_path, "drafts": list(draft_paths), "spec": specs,
                    "draft_max": args.draft_max, "workloads": workloads, "clients": args.clients,
                    "requests_per_client": args.requests_per_client, "n_predict": args.n_predict,
                    "temperatures": args.temp, "seed": args.seed, "ignore_eos": args.ignore_eos,
                    "n_ctx": args.ctx_size, "server_parallel": args.parallel if served else None,
                    "endpoints": args.endpoint, "auto_profile_from": args.auto_profile_from,
                    "no_auto_profile": args.no_auto_profile}
        report = {"load": rows, "pairs": [list(p) for p in pairs], "runs": runs, "settings": settings,
                  "work": {str(n): [[[r.workload, r.index] for r in client] for client in w] for n, w in work.items()},
                  "machine": machine_info(args.threads)}
        try:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(report, f, indent=1)
                f.write("\n")
        except OSError as e:
            raise CliError(f"cannot write {args.json}: {e}") from None
    if served is not None:
        print(f"through `specserve serve -np {args.parallel}` of the bench's own (streamed /completion)"
              + (f", auto from {args.auto_profile_from}" if args.auto_profile_from else "") + "\n")
    print(render_load(rows, args.requests_per_client, [os.path.basename(w) for w in workloads]))
    return 0


def _configs(args, specs: list[str], draft_paths: dict[str, str]):
    from ..bench.runner import plan_configs

    try:
        configs = plan_configs(specs, list(draft_paths), args.draft_max, args.endpoint, args.ngram_max,
                               ("server",), args.endpoint_baseline)
    except ValueError as e:
        raise CliError(str(e), 2) from None
    return [c for c in configs if c.via == "server" or c.spec == "endpoint"]  # auto-fresh: in-process only


def pair_up(configs) -> list[tuple[str, str]]:
    """(configuration, its no-speculation baseline) for every configuration that is not a baseline; a baseline
    that no configuration pairs with runs alone ((name, name))."""
    def is_baseline(c) -> bool:
        return c.spec == "none" or c.baseline == c.name

    pairs = [(c.name, c.baseline) for c in configs if not is_baseline(c)]
    used = {base for _, base in pairs}
    return pairs + [(c.name, c.name) for c in configs if is_baseline(c) and c.name not in used]


def _target(args, config, served):
    """Where a configuration's requests go: its endpoint as it is, or the bench's own server with the
    configuration's `speculative` object (the target alone: mode none)."""
    from ..bench.clients import LoadTarget

    if config.spec == "endpoint":
        url = config.endpoint.rstrip("/")
        return LoadTarget(config.name, url[:-3] if url.endswith("/v1") else url, ignore_eos=args.ignore_eos)
    k = config.draft_max if config.spec != "none" else 0
    speculative = {"mode": config.spec, "draft_max": k, "suffix_max": k if config.spec == "suffix" else
                   SUFFIX_MAX_DEFAULT, "verify": args.verify}
    return LoadTarget(config.name, served.url(config.draft_model), {"speculative": speculative}, args.ignore_eos)


def _requests(args, target_path: str, workloads: list[str]) -> tuple[dict, object]:
    """({workload: its prompts as Requests}, the warm-up's Request): token ids by the target's own tokenizer
    and chat template, each prompt's temperature (--temp, else the workload's own, else 0), length (-n, else
    its own, else 128) and seed; prompts that do not fit the context with their answer are left out."""
    from ..backends.llama_cpp import LlamaCppModel
    from ..bench.clients import Request, request_seed
    from ..bench.runner import WARMUP_MESSAGES
    from ..bench.workloads import load_workload
    from ..prompt import chat_tokens, prompt_tokens

    try:
        loaded = {w: load_workload(w, args.prompts_per_workload) for w in workloads}
    except ValueError as e:
        raise CliError(str(e), 2) from None
    if any(p.answers_needed for ps in loaded.values() for p in ps):
        raise CliError("--clients sends each prompt on its own: multi-turn workloads are not supported", 2)
    try:
        vocab = LlamaCppModel(target_path, vocab_only=True)
    except (OSError, ValueError) as e:
        raise CliError(f"cannot read the target's vocabulary: {e}") from None
    out, skipped = {}, 0
    try:
        for w, ps in loaded.items():
            out[w] = []
            for p in ps:
                tokens = chat_tokens(vocab, list(p.messages)) if p.chat else prompt_tokens(vocab, p.text)
                n = args.n_predict or p.max_tokens or 128
                if len(tokens) + n >= args.ctx_size:
                    skipped += 1
                    continue
                t = args.temp[0] if args.temp else (p.temperature or 0.0)
                out[w].append(Request(w, p.index, tuple(tokens), n, t, request_seed(args.seed, w, p.index)))
        warm = Request("warm-up", 0, tuple(chat_tokens(vocab, list(WARMUP_MESSAGES))), 8, 0.0, args.seed)
    finally:
        vocab.close()
    if skipped:
        print(f"warning: {skipped} prompt(s) do not fit the context of {args.ctx_size} tokens with their output; "
              "skipped (raise -c)", file=sys.stderr)
    if not any(out.values()):
        raise CliError("no prompt fits the context", 2)
    return out, warm
