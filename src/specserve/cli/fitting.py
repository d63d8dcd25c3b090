"""--fit on `serve`, `generate` and `check`: the flags, the GPU budget, and the fitted ModelConfig (fit.py).

As llama-server's `-fit on` (its default; here off unless asked: -ngl 0, the CPU, is the default): -c, -ngl
and -ngld given on the command line are kept, and the fit chooses the rest. Where there is no GPU (a build
for the CPU only, or none seen) `serve` and `generate` say so and go on at the flags as given, as
llama-server does ("no devices with dedicated memory found"); `check` plans for `--gpu-budget` on any build.
"""
from __future__ import annotations

import dataclasses
import sys

from ..fit import FIT_CTX_DEFAULT, FIT_TARGET_MIB_DEFAULT
from .common import CliError

MIB = 1 << 20


def add_fit_args(g) -> None:
    g.add_argument("-fit", "--fit", nargs="?", const="on", default="off", choices=("on", "off"),
                   help="choose what -c, -ngl and -ngld leave unset so that the models fit the GPU's memory, as "
                   "llama-server's --fit: every layer at the target's training context if it fits, else a "
                   "smaller context (down to --fit-ctx), else fewer of the target's layers; the draft's cache "
                   "counted at its window (--draft-ctx). Default off; with no GPU it says so and changes nothing")
    g.add_argument("-fitt", "--fit-target", type=int, default=FIT_TARGET_MIB_DEFAULT, metavar="MiB",
                   help=f"GPU memory --fit leaves free (default {FIT_TARGET_MIB_DEFAULT}, llama-server's)")
    g.add_argument("-fitc", "--fit-ctx", type=int, default=FIT_CTX_DEFAULT, metavar="N",
                   help=f"the least context --fit sets (default {FIT_CTX_DEFAULT}, llama-server's)")
    g.add_argument("--gpu-budget", metavar="SIZE", help="the GPU's free memory to plan for, e.g. 24GiB (default: "
                   "what llama.cpp reports for the first GPU); --fit leaves --fit-target of it free")


def fit_budget(args, plan: bool) -> tuple[int | None, str]:
    """(bytes --fit may fill, where they come from), or (None, why there is nothing to fit). plan: a plan
    from the headers (check), which --gpu-budget makes on any build."""
    from ..backends.devices import gpu_offload, list_devices
    from ..memory import fmt_bytes, parse_bytes

    if args.fit_target < 0:
        raise CliError(f"--fit-target must be >= 0 MiB, got {args.fit_target}", 2)
    if args.fit_ctx < 16:
        raise CliError(f"--fit-ctx must be >= 16, got {args.fit_ctx}", 2)
    if not plan and not gpu_offload():
        return None, "llama-cpp-python is built for the CPU only"
    if args.gpu_budget is not None:
        try:
            free, source = parse_bytes(args.gpu_budget), "--gpu-budget"
        except ValueError as e:
            raise CliError(str(e), 2) from None
    else:
        gpus = [d for d in list_devices() if d.kind in ("GPU", "iGPU") and d.free]
        if not gpus:
            return None, "llama.cpp sees no GPU" + (" and no --gpu-budget was given" if plan else "")
        free, source = gpus[0].free, f"{gpus[0].name}'s free memory"
    budget = free - args.fit_target * MIB
    where = f"{fmt_bytes(free)} ({source}) less --fit-target {args.fit_target} MiB"
    if budget <= 0:
        raise CliError(f"--fit: no GPU memory to fit to: {where}", 2)
    return budget, where


def fitted(cfg, args, n_seq: int = 1, plan: bool = False):
    """cfg with the context and layers --fit chose (unchanged without --fit, or without a GPU); what it
    chose is kept in args.fit_result and, unless plan (check renders it), printed to stderr."""
    from ..config import default_ubatch
    from ..fit import FitError, Model, fit

    if getattr(args, "fit", "off") != "on":
        return cfg
    budget, where = fit_budget(args, plan)
    if budget is None:
        args.fit_result = {"skipped": where}
        if not plan:
            print(f"fit: {where}: no GPU to fit to; the models run on the CPU at -c {cfg.n_ctx}", file=sys.stderr)
        return cfg
    given = getattr(args, "given", set())
    ngl = cfg.n_gpu_layers if "n_gpu_layers" in given else None
    ngld = cfg.n_gpu_layers_draft if "n_gpu_layers_draft" in given else None
    n_ubatch = args.ubatch_size if getattr(args, "ubatch_size", None) is not None else \
        default_ubatch(-1 if ngl is None else ngl)  # the fit puts the target's layers on the GPU
    try:
        target = Model.from_gguf(cfg.target_path, n_ubatch, ngl)
        draft = Model.from_gguf(cfg.draft_path, cfg.n_ubatch_draft, ngld, cfg.draft_ctx) if cfg.draft_path else None
    except (OSError, ValueError) as e:
        raise CliError(f"--fit: cannot read the models' GGUF headers: {e}") from None
    try:
        chosen = fit(target, draft, budget, cfg.n_ctx if "ctx_size" in given else None, args.fit_ctx, n_seq)
    except FitError as e:
        raise CliError(f"--fit: {e} ({fit_advice(ngl, ngld)}; budget: {where})", 2) from None
    args.fit_result = {**chosen.as_dict(), "budget_source": where, "draft_ctx": cfg.draft_ctx if draft else None}
    if not plan:
        print(fit_line(args.fit_result), file=sys.stderr)
    try:
        return dataclasses.replace(cfg, n_ctx=chosen.n_ctx, n_gpu_layers=chosen.n_gpu_layers,
                                   n_gpu_layers_draft=chosen.n_gpu_layers_draft or 0,
                                   n_ubatch=n_ubatch)
    except ValueError as e:
        raise CliError(f"--fit: {e}", 2) from None


def fit_advice(ngl: int | None, ngld: int | None) -> str:
    given = " ".join(f for f, n in (("-ngl", ngl), ("-ngld", ngld)) if n is not None)
    return ("free GPU memory, lower --fit-ctx or -c" + (f", give fewer layers ({given})" if given else "") +
            ", or leave out --fit to run on the CPU")


def _flags(fit: dict) -> str:
    draft = fit.get("draft")
    return (f"-c {fit['n_ctx']} -ngl {fit['target']['on_gpu']}/{fit['target']['n_layers']}" +
            (f" -ngld {draft['on_gpu']}/{draft['n_layers']}" if draft else ""))


def fit_line(fit: dict) -> str:
    """serve's and generate's start-up line."""
    from ..memory import fmt_bytes

    changed = "; ".join(fit["changed"]) or "everything fits"
    slots = f" for {fit['n_seq']} slots" if fit["n_seq"] > 1 else ""
    return (f"fit: {_flags(fit)}{slots} in {fmt_bytes(fit['budget_bytes'])} of GPU memory "
            f"({fit['budget_source']}): {changed}; GPU {fmt_bytes(fit['gpu_bytes'])}, "
            f"RAM {fmt_bytes(fit['ram_bytes'])}")


def render_fit(fit: dict) -> str:
    """check's fit section."""
    from ..memory import fmt_bytes

    if "skipped" in fit:
        return f"\nfit (--fit)\n  {fit['skipped']}: nothing to fit (--gpu-budget SIZE plans for a GPU)"
    slots = f" for {fit['n_seq']} slots, as serve -np {fit['n_seq']}" if fit["n_seq"] > 1 else ""
    lines = ["", f"fit (--fit{slots}; estimated from the GGUF headers)",
             f"  budget {fmt_bytes(fit['budget_bytes'])} of GPU memory: {fit['budget_source']}",
             f"  chosen: {_flags(fit)} ({'; '.join(fit['changed']) or 'everything fits as asked'})"]
    for role in ("target", "draft"):
        if fit.get(role):
            sp = fit[role]
            lines.append(f"  {role + ' ' + str(sp['on_gpu']) + '/' + str(sp['n_layers']) + ' layers on the GPU':<40} "
                         f"GPU {fmt_bytes(sp['gpu']):>10}   RAM {fmt_bytes(sp['ram']):>10}")
    lines.append(f"  {'total':<40} GPU {fmt_bytes(fit['gpu_bytes']):>10}   RAM {fmt_bytes(fit['ram_bytes']):>10}")
    if any(0 < fit[r]["on_gpu"] < fit[r]["n_layers"] for r in ("target", "draft") if fit.get(r)):
        lines.append("  (a model split between the two: its compute buffer counts on both sides, an upper bound)")
    if fit.get("no_draft_ctx") is not None and not any("layers" in c for c in fit["changed"]):
        whole = fit.get("whole_draft_ctx")
        lines.append(f"  largest context in this budget: {fit['no_draft_ctx']} without the draft, {fit['n_ctx']} "
                     "with it" +
                     (f" at its window (--draft-ctx {fit['draft_ctx']}),\n    {whole} with the draft at the whole "
                      "context" if whole is not None else ""))
    return "\n".join(lines)
