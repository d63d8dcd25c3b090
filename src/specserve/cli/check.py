"""`specserve check`: can this draft serve this target, and what will the pair cost in memory?

Prints the pairing report (problems refuse the pair: exit status 2) and the memory
of both models at the given context (the draft's cache at its window, --draft-ctx; each
compute buffer at its micro-batch, -ub and -ubd):
estimated from GGUF metadata alone, measured by creating the contexts, and the largest
context that fits a memory budget with the draft at its window, with the draft at the
whole context, and without a draft. --memory-only reads the GGUF headers alone (a file
holding only a header is enough: the shapes of a model not downloaded). With -ngl/-ngld, each model's
split between GPU memory and RAM; with --fit, the context and layers `serve --fit` would choose for a GPU
(cli/fitting.py), planned for --gpu-budget on any build, the report then at that context.
"""
from __future__ import annotations

import json
import sys

from .common import CliError, add_model_args, model_config
from .fitting import add_fit_args, fitted, render_fit

_KV_TYPE = "f16"  # what our llama.cpp contexts allocate


def add_parser(sub) -> None:
    p = sub.add_parser("check", help="check a target/draft pair: vocabulary compatibility and memory",
                       description="Check that a draft can serve a target (exit status 2 if not) and show the "
                                   "memory both take: estimated from the GGUF files, measured, and the largest "
                                   "context that fits a budget.")
    add_model_args(p)
    p.add_argument("--budget", metavar="SIZE", help="memory budget, e.g. 24GiB, 512MiB, 8GB (default: this "
                   "machine's RAM)")
    g = p.add_argument_group("GPU (-ngl/-ngld's split, and --fit's choice)")
    add_fit_args(g)
    g.add_argument("-np", "--parallel", type=int, default=1, metavar="N", help="--fit for N slots, each with a "
                   "context of its own, as `serve -np N` (serve's default: 2); default 1")
    p.add_argument("--no-measure", action="store_true", help="estimate only; do not create the contexts")
    p.add_argument("--memory-only", action="store_true", help="the memory estimate from the GGUF headers alone: "
                   "no pairing check, nothing loaded (a header-only GGUF with a model's shapes is enough)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    p.set_defaults(run=run)


def run(args) -> int:
    from .. import memory
    from ..backends import load_model
    from ..pairing import PairingReport, check_pairing

    if args.ctx_size <= 0:
        raise CliError(f"context size must be > 0, got {args.ctx_size}", 2)
    budget, budget_source = _budget(args.budget)
    if args.parallel < 1:
        raise CliError(f"--parallel must be >= 1, got {args.parallel}", 2)
    cfg = fitted(model_config(args), args, n_seq=args.parallel, plan=True)
    paths = {"target": cfg.target_path, "draft": cfg.draft_path}
    shapes = {}
    for role, path in paths.items():
        if path is None:
            continue
        try:
            shapes[role] = memory.ModelShape.from_gguf(path)
        except (OSError, ValueError) as e:
            raise CliError(f"cannot read the {role} model's metadata: {e}") from None
    report, measured, loaded = PairingReport(), {}, {}
    n_ctx = {"target": cfg.n_ctx, "draft": memory.cells(cfg.n_ctx, cfg.draft_ctx)}
    n_ubatch = {"target": cfg.n_ubatch, "draft": cfg.n_ubatch_draft}
    try:
        for role, path in paths.items():
            if path is not None and not args.memory_only:
                loaded[role] = load_model(path, n_threads=cfg.n_threads, exact=cfg.exact and role == "target")
        exact = getattr(loaded.get("target"), "exact_check", None)
        if exact is not None:  # --exact: what the start-up check found on this build
            print(f"exact: {'yes' if exact.exact else 'NO'}: {exact.detail}")
        if "draft" in loaded:
            report = check_pairing(loaded["target"], loaded["draft"])
        if not args.no_measure:
            measured = {role: memory.measure(m, n_ctx[role], n_ubatch[role]) for role, m in loaded.items()}
    except (ValueError, MemoryError) as e:
        raise CliError(str(e)) from None
    finally:
        for m in loaded.values():
            m.close()
    result = {**report.as_dict(), "memory": _memory_report(shapes, measured, n_ctx, cfg.draft_ctx, budget,
                                                           budget_source, n_ubatch)}
    if args.memory_only:
        result["pairing_checked"] = False
    result["devices"] = _devices()
    layers = {"target": cfg.n_gpu_layers, "draft": cfg.n_gpu_layers_draft}
    if getattr(args, "fit_result", None) is not None:
        result["fit"] = args.fit_result
    elif any(layers.values()):
        result["memory"]["offload"] = _offload(shapes, n_ctx, n_ubatch, layers, args.gpu_budget, result["devices"])
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(_render(paths, report, result["memory"], shapes, measured, args.memory_only))
        if "offload" in result["memory"]:
            print(_render_offload(result["memory"]["offload"]))
        if "fit" in result:
            print(render_fit(result["fit"]))
        print(_render_devices(result["devices"]))
    return 2 if report.flagrant else 0


def _budget(text: str | None) -> tuple[int, str]:
    from ..memory import parse_bytes, physical_memory

    if text is not None:
        try:
            return parse_bytes(text), "--budget"
        except ValueError as e:
            raise CliError(str(e), 2) from None
    ram = physical_memory()
    if ram is None:
        raise CliError("cannot tell this machine's memory; pass --budget", 2)
    return ram, "this machine's RAM"


def _memory_report(shapes, measured, n_ctx: dict, window: int, budget: int, budget_source: str,
                   n_ubatch: dict) -> dict:
    """n_ctx: the tokens each role's cache holds (the draft's: its window); n_ubatch: each role's micro-batch."""
    from ..memory import estimate, max_ctx_in_budget, relative_error

    est = {role: estimate(s, n_ctx[role], _KV_TYPE, n_ubatch=n_ubatch[role]) for role, s in shapes.items()}
    limit = shapes["target"].n_ctx_train or 1 << 20
    both, ubatches = list(shapes.values()), [n_ubatch[role] for role in shapes]
    with_draft = max_ctx_in_budget(both, budget, limit, _KV_TYPE, [0, window], ubatches)
    full_draft = max_ctx_in_budget(both, budget, limit, _KV_TYPE, None, ubatches)
    without = max_ctx_in_budget([shapes["target"]], budget, limit, _KV_TYPE, None, ubatches[:1])
    draft_full = (estimate(shapes["draft"], n_ctx["target"], _KV_TYPE, n_ubatch=n_ubatch["draft"])
                  if "draft" in est else None)
    out = {
        "n_ctx": n_ctx["target"], "cache_type": _KV_TYPE, "budget_bytes": budget, "budget_source": budget_source,
        "target": {"path": shapes["target"].path, **est["target"].as_dict()},
        "draft": {"path": shapes["draft"].path, **est["draft"].as_dict()} if "draft" in est else None,
        "draft_ctx": n_ctx["draft"] if "draft" in est else None,
        "draft_full_context": draft_full.as_dict() if draft_full else None,
        "total_bytes": sum(e.total for e in est.values()),
        "n_ctx_train": shapes["target"].n_ctx_train, "max_ctx_in_budget": with_draft,
        "max_ctx_in_budget_full_draft": full_draft if "draft" in est else None,
        "max_ctx_in_budget_without_draft": without,
        "draft_cost_bytes": est["draft"].total if "draft" in est else 0,
        "measured": None,
    }
    if measured:
        fields = ("weights", "kv", "compute", "total")
        out["measured"] = {
            **{role: m.as_dict() for role, m in measured.items()},
            "total_bytes": sum(m.total for m in measured.values()),
            "relative_error": {role: {f: _round(relative_error(getattr(est[role], f), getattr(m, f)))
                                      for f in fields} for role, m in measured.items()},
        }
    return out


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _render(paths, report, mem: dict, shapes, measured, memory_only: bool = False) -> str:
    from ..memory import fmt_bytes, kv_cells

    lines = [f"{role:7} {path}" for role, path in paths.items() if path]
    if paths["draft"] is None:
        lines.append("pairing: no draft model given (-md); memory of the target alone")
    elif memory_only:
        lines.append("pairing: not checked (--memory-only)")
    elif report.flagrant:
        lines.append(f"pairing: REFUSED, this draft cannot serve this target ({len(report.problems)} problem(s))")
    else:
        lines.append(f"pairing: compatible ({len(report.warnings)} warning(s))")
    lines += [f"  problem: {p}" for p in report.problems] + [f"  warning: {w}" for w in report.warnings]
    n_ctx = mem["n_ctx"]
    lines += ["", f"memory at context {n_ctx} ({kv_cells(n_ctx)} KV cells, {_KV_TYPE.upper()} cache)"]
    if mem["draft"] is not None and mem["draft_ctx"] < n_ctx:
        lines.append(f"  the draft's cache is its window (--draft-ctx {mem['draft_ctx']}): "
                     f"{kv_cells(mem['draft_ctx'])} cells, the first and the latest tokens")
    lines.append(f"  {'':<40} {'estimated':>12} {'measured':>11} {'error':>8}")
    for role in shapes:
        est, got = mem[role], measured.get(role)
        per_token = fmt_bytes(est["kv_per_token"]) + "/token"
        rows = [("weights", "weights")]
        if est["repacked"] or (got and got.repacked):
            rows.append(("weights: repacked copy", "repacked"))
        flag = "-ubd" if role == "draft" else "-ub"
        for label, field in (*rows, (f"KV cache ({per_token})", "kv"),
                             (f"compute buffer ({flag} {est['n_ubatch']})", "compute"), ("total", "total")):
            a = est[field]
            b = getattr(got, field) if got else None
            err = f"{100 * (a - b) / b:+6.1f}%" if b else ""
            shown = fmt_bytes(b) if b is not None else "-"
            lines.append(f"  {role + ' ' + label:<40} {fmt_bytes(a):>12} {shown:>11} {err:>8}")
    measured_total = mem["measured"]["total_bytes"] if mem["measured"] else None
    lines.append(f"  {'total':<40} {fmt_bytes(mem['total_bytes']):>12} "
                 f"{fmt_bytes(measured_total) if measured_total else '-':>11}")
    full = mem["draft_full_context"]
    if full is not None and mem["draft_ctx"] < n_ctx:
        lines.append(f"  {'(draft at the whole context: KV cache)':<40} {fmt_bytes(full['kv']):>12}")
        lines.append(f"  {'(draft at the whole context: total)':<40} {fmt_bytes(full['total']):>12}")
    if any(mem[role]["repacked"] for role in shapes):
        lines.append("  (repacked copy: llama.cpp's CPU backend keeps Q4_0/Q4_K/IQ4_NL matrices a second time,")
        lines.append("   interleaved for its faster batched kernels, beside the memory-mapped file)")
    lines.append("")
    if mem["n_ctx_train"] and n_ctx > mem["n_ctx_train"]:
        lines.append(f"note: context {n_ctx} exceeds the target's training context {mem['n_ctx_train']}")
    lines.append(_budget_line(mem))
    return "\n".join(lines)


def _budget_line(mem: dict) -> str:
    from ..memory import fmt_bytes

    budget = f"budget {fmt_bytes(mem['budget_bytes'])} ({mem['budget_source']})"
    with_draft, without, cap = mem["max_ctx_in_budget"], mem["max_ctx_in_budget_without_draft"], mem["n_ctx_train"]
    capped = f" (capped at the target's training context {cap})" if cap and without == cap else ""
    if without == 0:
        return f"{budget}: the target alone does not fit even at 256 tokens"
    if mem["draft"] is None:
        return f"{budget}: largest context {without}{capped}"
    if with_draft == 0:
        return f"{budget}: the target fits up to {without} tokens alone, but not with the draft"
    line = (f"{budget}: the draft costs {fmt_bytes(mem['draft_cost_bytes'])} at {mem['n_ctx']} tokens: "
            f"largest context {without}{capped} -> {with_draft} with the draft")
    if mem["draft_ctx"] < mem["n_ctx"]:
        line += (f" at its window of {mem['draft_ctx']}, {mem['max_ctx_in_budget_full_draft']} with the draft "
                 "at the whole context")
    return line


def _devices() -> dict:
    """What llama.cpp sees (backends/devices.py): each device, and whether this build can offload layers."""
    from dataclasses import asdict

    from ..backends.devices import gpu_offload, list_devices

    return {"gpu_offload": gpu_offload(), "list": [asdict(d) for d in list_devices()]}


def _render_devices(devices: dict) -> str:
    from ..backends.devices import Device, offload_status

    listed = [Device(**d) for d in devices["list"]]
    lines = ["", "devices (llama.cpp)"] + [f"  {d.kind:<11} {d.describe()}" for d in listed]
    return "\n".join([*lines, "  " + offload_status(listed, devices["gpu_offload"])])


def _offload(shapes, n_ctx: dict, n_ubatch: dict, layers: dict, gpu_budget: str | None, devices: dict) -> dict:
    """-ngl/-ngld's split of each model between GPU memory and RAM (offload.py), and whether the GPU share fits
    --gpu-budget, else the free memory of the first GPU llama.cpp sees (none seen and no --gpu-budget: a plan)."""
    from ..memory import estimate, parse_bytes
    from ..offload import LayerWeights, most_layers_within, split

    if gpu_budget is not None:
        try:
            budget, source = parse_bytes(gpu_budget), "--gpu-budget"
        except ValueError as e:
            raise CliError(str(e), 2) from None
    else:
        gpus = [d for d in devices["list"] if d["kind"] in ("GPU", "iGPU") and d["free"]]
        budget, source = (gpus[0]["free"], f"{gpus[0]['name']}'s free memory") if gpus else (None, None)
    est = {role: estimate(s, n_ctx[role], _KV_TYPE, n_ubatch=n_ubatch[role]) for role, s in shapes.items()}
    weights = {role: LayerWeights.from_gguf(s.path, s.n_layer) for role, s in shapes.items()}
    splits = {role: split(shapes[role], weights[role], est[role], layers[role]) for role in shapes}
    out = {"n_gpu_layers": {role: layers[role] for role in shapes}, "gpu_budget_bytes": budget,
           "gpu_budget_source": source, **{role: sp.as_dict() for role, sp in splits.items()},
           "gpu_bytes": sum(sp.gpu for sp in splits.values()), "ram_bytes": sum(sp.ram for sp in splits.values())}
    if budget is not None:
        beside = sum(sp.gpu for role, sp in splits.items() if role != "target")
        out["fits"] = out["gpu_bytes"] <= budget
        out["most_target_layers"] = most_layers_within(shapes["target"], weights["target"], est["target"],
                                                       budget - beside)
    return out


def _render_offload(off: dict) -> str:
    from ..memory import fmt_bytes

    flags = {"target": "-ngl", "draft": "-ngld"}
    asked = " ".join(f"{flags[r]} {n if n >= 0 else 'all'}" for r, n in off["n_gpu_layers"].items())
    lines = ["", f"GPU offload ({asked}; estimated from the GGUF headers)"]
    for role in off["n_gpu_layers"]:
        sp = off[role]
        lines.append(f"  {role + ' ' + str(sp['on_gpu']) + '/' + str(sp['n_layers']) + ' layers on the GPU':<40} "
                     f"GPU {fmt_bytes(sp['gpu']):>10}   RAM {fmt_bytes(sp['ram']):>10}")
    lines.append(f"  {'total':<40} GPU {fmt_bytes(off['gpu_bytes']):>10}   RAM {fmt_bytes(off['ram_bytes']):>10}")
    if off["gpu_budget_bytes"] is None:
        lines.append("  no GPU seen here and no --gpu-budget: the split of a plan, checked against nothing")
    else:
        budget = f"{fmt_bytes(off['gpu_budget_bytes'])} ({off['gpu_budget_source']})"
        most = off["most_target_layers"]
        lines.append(f"  GPU budget {budget}: " + ("fits" if off["fits"] else
                     f"does not fit; -ngl {most} is the most of the target's layers that fit" +
                     (" beside the draft's" if "draft" in off["n_gpu_layers"] else "") if most else
                     "does not fit, not even the target's output layer"))
    if any(0 < off[r]["on_gpu"] < off[r]["n_layers"] for r in off["n_gpu_layers"]):
        lines.append("  (a model split between the two: its compute buffer counts on both sides, an upper bound)")
    return "\n".join(lines)
