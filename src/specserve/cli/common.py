"""Flags shared by generate, serve and bench, and how they become config objects."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..config import DEFAULT_VERIFY, DRAFT_CTX_DEFAULT, SPEC_MODES, UBATCH_DEFAULT, UBATCH_DRAFT_DEFAULT, \
    UBATCH_GPU_DEFAULT, VERIFY_METHODS, ModelConfig, SamplingParams, SpecParams, default_ubatch, draft_max_caps_suffix
from ..models import PAIRS

DRAFT_WORDS = ("auto", "none")  # -md's values that name no file


class CliError(Exception):
    """A user-facing failure: printed as one line, exit status `code`."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


class Given(argparse.Action):
    """Stores the value and notes that the flag was given: --fit chooses only what was not (cli/fitting.py)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.given = {*getattr(namespace, "given", ()), self.dest}


def add_model_args(p: argparse.ArgumentParser, draft: bool = True, ubatch: bool = True) -> None:
    """The models and how they are loaded; ubatch: with -ub (and -ubd with a draft)."""
    g = p.add_argument_group("models")
    g.add_argument("-m", "--model", metavar="TARGET", help="target GGUF path or packaged model name "
                   "(default: the --pair's target)")
    if draft:
        g.add_argument("-md", "--model-draft", metavar="DRAFT", help="draft GGUF path or packaged name "
                       "(default with no -m: the --pair's draft); auto: the cheapest model at hand whose "
                       "vocabulary pairs with the target (the packaged ones, --draft-candidates, the target's "
                       "folder), printed with its reason; none: no draft model")
        add_draft_candidates_arg(g)
    g.add_argument("--pair", choices=tuple(PAIRS), default="qwen",
                   help="packaged target/draft pair used where -m/-md are not given: qwen = Qwen2.5-Coder 1.5B "
                        "F16 target + 0.5B draft, the reference pair (default); smollm2 = SmolLM2-135M F16 "
                        "target + its Q4_1, the fast testbed")
    g.add_argument("-c", "--ctx-size", type=int, default=4096, action=Given, metavar="N",
                   help="context size (default 4096; with --fit on a GPU, the largest that fits)")
    if draft:
        add_draft_ctx_arg(g)
    g.add_argument("-ngl", "--gpu-layers", "--n-gpu-layers", dest="n_gpu_layers", type=gpu_layers, default=0,
                   action=Given, metavar="N", help="target layers on the GPU (default 0; all: every layer; a build "
                   "for the CPU only refuses more than 0, naming the install line that fixes it)")
    if draft:
        g.add_argument("-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft", dest="n_gpu_layers_draft",
                       type=gpu_layers, default=0, action=Given, metavar="N",
                       help="draft layers on the GPU (default 0; all)")
    g.add_argument("-t", "--threads", type=int, default=None, metavar="N", help="CPU threads (default: all cores)")
    if ubatch:
        add_ubatch_args(g, draft)
    g.add_argument("--exact", action="store_true",
                   help="the target's verification passes round bit for bit as its one-token steps (flash "
                        "attention, micro-batches of at most 63, no repacked weights; checked on the loaded model "
                        "at start): speculation then never changes a greedy answer, on quantized weights too, at "
                        "the cost docs/exactness.md measures")


def add_ubatch_args(g, draft: bool = True) -> None:
    g.add_argument("-ub", "--ubatch-size", dest="ubatch_size", type=int, default=None, metavar="N",
                   help="the target's micro-batch, as llama-server's: llama.cpp computes at most N tokens at once "
                   "and sizes its compute buffer for N (logits over the vocabulary for each); a longer pass (a "
                   f"prompt) is split into passes of N. Default {UBATCH_DEFAULT} on a CPU, where prompt speed is "
                   f"the same from 32 to 512 (docs/models.md); {UBATCH_GPU_DEFAULT} with -ngl, as on a GPU larger "
                   "micro-batches pay for prompt processing")
    if draft:
        g.add_argument("-ubd", "--ubatch-size-draft", dest="ubatch_size_draft", type=int,
                       default=UBATCH_DRAFT_DEFAULT, metavar="N",
                       help="the draft model's micro-batch: its steps are a few tokens (--draft-max 8 and the "
                       "tokens it catches up), and its prompt goes in passes of N. Its compute buffer shrinks with "
                       "N (for a 152k vocabulary: 300 MiB at 512, 37.5 MiB at 64, 9.4 MiB at 16). Default "
                       f"{UBATCH_DRAFT_DEFAULT}: the draft's steps fit in one pass and its prompt prefill keeps its "
                       "speed (as fast as at 512 on a CPU, about 107 tokens per CPU-second; 0.70-0.87x of that at "
                       "16) with a buffer 8x smaller than 512's (docs/models.md)")


def add_draft_candidates_arg(g) -> None:
    g.add_argument("--draft-candidates", action="append", default=[], metavar="DIR|FILE|NAME=FILE",
                   help="with -md auto: a folder whose GGUF files may draft too, or one file, named NAME if "
                        "given (repeatable)")


def gpu_layers(text: str) -> int:
    """-ngl/-ngld: a number of layers, or `all` (-1: llama.cpp puts every layer on the GPU)."""
    if text.strip().lower() == "all":
        return -1
    if text.strip().lower() == "auto":  # llama-server's: as many as fit the free memory
        raise argparse.ArgumentTypeError("auto (llama-server's fit to free memory) is not supported here: give a "
                                         "number of layers, or all, or leave -ngl out and pass --fit")
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of layers or all, got {text!r}") from None


def add_draft_ctx_arg(g) -> None:
    g.add_argument("--draft-ctx", "-cd", "--ctx-size-draft", dest="draft_ctx", type=int, default=DRAFT_CTX_DEFAULT,
                   metavar="N", help="the draft model's cache: N cells, holding the sequence's first 4 tokens and its "
                   f"most recent ones; it prefills no more of a prompt (default {DRAFT_CTX_DEFAULT}; 0: the whole "
                   "context, as -c). Output is the target's whatever N; docs/draft-window.md")


def draft_windows(args, draft_paths: dict[str, str]) -> dict[str, int]:
    """`bench --draft-ctx LIST`: each bench draft's window (a name DRAFT@ctxN says its own)."""
    return {name: int(name.rpartition("@ctx")[2]) if len(args.draft_ctx) > 1 else args.draft_ctx[0]
            for name in draft_paths}


def add_spec_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("speculation")
    g.add_argument("--spec", choices=SPEC_MODES, default="auto",
                   help="auto: choose drafter and length per step (default); draft: draft model; "
                        "ngram: prompt lookup; suffix: suffix matching over this request and earlier ones; "
                        "none: target alone")
    g.add_argument("--draft-max", "--draft", "--spec-draft-n-max", dest="draft_max", type=int, default=None,
                   metavar="N", help="most tokens drafted per step (default 8, 64 for --spec suffix; "
                                     "a cap under --spec auto)")
    g.add_argument("--draft-min", "--spec-draft-n-min", dest="draft_min", type=int, default=0, metavar="N",
                   help="drop greedy drafts shorter than this (default 0)")
    g.add_argument("--draft-p-min", "--spec-draft-p-min", dest="draft_p_min", type=float, default=0.0,
                   metavar="P", help="stop drafting where the draft's top probability is below P (default 0)")
    g.add_argument("--verify", choices=VERIFY_METHODS, default=DEFAULT_VERIFY,
                   help="sampled verification: auto (default: gumbel for a request with a seed, rejection for one "
                        "without), gumbel (the text for a seed is the target alone's, whatever is speculated) "
                        "or rejection (keeps more of a draft model's tokens; which text a seed gives varies)")
    g.add_argument("--no-auto-profile", action="store_true",
                   help="start --spec auto from its priors: neither read nor write what it learnt on these "
                        "models before (kept in ~/.cache/specserve/auto)")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("-n", "--n-predict", type=int, default=256, metavar="N", help="tokens to generate (default 256)")
    g.add_argument("--temp", type=float, default=0.0, metavar="T", help="temperature; 0 = greedy (default)")
    g.add_argument("--top-k", type=int, default=0, metavar="K", help="0 = off (default)")
    g.add_argument("--top-p", type=float, default=1.0, metavar="P", help="1 = off (default)")
    g.add_argument("--min-p", type=float, default=0.0, metavar="P", help="0 = off (default)")
    g.add_argument("--seed", type=int, default=None, metavar="S", help="random seed (same seed, same output)")
    g.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-generation tokens")


def _config(factory, **kw):
    try:
        return factory(**kw)
    except ValueError as e:
        raise CliError(str(e), 2) from None


def check_offload(args) -> None:
    """-ngl/-ngld above 0 where this llama.cpp cannot offload: refused (exit status 2) before any model is
    pulled or loaded, with the line that rebuilds it for the GPU (backends/devices.py)."""
    from ..backends.devices import OffloadUnavailable, require_offload

    if getattr(args, "memory_only", False):  # check --memory-only loads nothing: the split of a plan (offload.py)
        return
    try:
        require_offload({"-ngl": args.n_gpu_layers, "-ngld": getattr(args, "n_gpu_layers_draft", 0)})
    except OffloadUnavailable as e:
        raise CliError(str(e), 2) from None


def model_config(args) -> ModelConfig:
    from .. import models

    check_offload(args)
    target, draft = args.model, getattr(args, "model_draft", None)
    pair_target, pair_draft = PAIRS[getattr(args, "pair", "qwen")]
    try:
        if target is None:
            target = models.ensure(pair_target)
            if draft is None and hasattr(args, "model_draft"):
                draft = models.ensure(pair_draft)
        else:
            target = models.resolve(target)
        if draft is not None and draft not in DRAFT_WORDS:
            draft = models.resolve(draft)
    except (FileNotFoundError, LookupError, RuntimeError) as e:
        raise CliError(str(e)) from None
    if draft in DRAFT_WORDS:  # -md auto / none: what was chosen and why, shown at start and by the server
        from ..draft_choice import none_choice

        args.draft_choice = auto_draft(args, str(target)) if draft == "auto" else none_choice(str(target))
        if draft == "auto":
            print("\n".join(args.draft_choice.lines()), file=sys.stderr)
        draft = args.draft_choice.draft_path
    return _config(ModelConfig, target_path=str(target), draft_path=str(draft) if draft else None,
                   n_ctx=args.ctx_size, n_gpu_layers=args.n_gpu_layers,
                   n_gpu_layers_draft=getattr(args, "n_gpu_layers_draft", 0), n_threads=args.threads,
                   draft_ctx=getattr(args, "draft_ctx", DRAFT_CTX_DEFAULT),
                   n_ubatch=_ubatch(args),
                   n_ubatch_draft=getattr(args, "ubatch_size_draft", UBATCH_DRAFT_DEFAULT),
                   exact=getattr(args, "exact", False),
                   auto_profile=not getattr(args, "no_auto_profile", False))


def candidate_sources(items) -> tuple[list[str], dict[str, str]]:
    """--draft-candidates: (folders and files, {file: NAME} for each NAME=FILE: a store's model by its name)."""
    sources, names = [], {}
    for item in items:
        name, eq, path = item.partition("=")
        if eq and name and not os.path.exists(item):
            path = str(Path(path).expanduser())
            names[path] = name
            item = path
        sources.append(item)
    return sources, names


def auto_draft(args, target: str):
    """`-md auto`: the best draft for `target` among the packaged models, --draft-candidates and the target's
    folder (draft_choice.py), with the target and the draft's memory counted against this machine's RAM; the
    one `bench --drafts auto` pinned for it first (draft_pins.py)."""
    from .. import draft_pins
    from ..draft_choice import candidate_paths, choose_draft
    from ..memory import ModelShape, estimate, physical_memory

    try:
        sources, names = candidate_sources(getattr(args, "draft_candidates", None) or ())
        candidates = candidate_paths(target, sources)
        target_memory = estimate(ModelShape.from_gguf(target), args.ctx_size, n_ubatch=_ubatch(args)).total
        window = getattr(args, "draft_ctx", DRAFT_CTX_DEFAULT)
        return choose_draft(target, candidates, n_ctx=args.ctx_size,
                            draft_ctx=window[0] if isinstance(window, list) else window,  # bench's: a list
                            n_ubatch_draft=getattr(args, "ubatch_size_draft", UBATCH_DRAFT_DEFAULT),
                            n_threads=args.threads, budget=physical_memory(), target_memory=target_memory,
                            pinned=draft_pins.pinned(target, args.threads or max(1, os.cpu_count() or 1)),
                            names=names)
    except (OSError, ValueError) as e:
        raise CliError(f"-md auto: cannot read the target {target}: {e}") from None


def _ubatch(args) -> int:
    """-ub as given, else the default for where the target's layers are (a CPU, or a GPU with -ngl)."""
    n = getattr(args, "ubatch_size", None)
    return n if n is not None else default_ubatch(args.n_gpu_layers)


def spec_params(args) -> SpecParams:
    kw = dict(mode=args.spec, draft_min=args.draft_min, draft_p_min=args.draft_p_min)
    if args.draft_max is not None:  # set by the user: it caps the suffix drafter too
        kw = draft_max_caps_suffix({**kw, "draft_max": args.draft_max}, ["draft_max"])
    if getattr(args, "no_cross_request", False):
        kw["cross_request"] = False
    return _config(SpecParams, **kw)


def sampling_params(args) -> SamplingParams:
    return _config(SamplingParams, temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                   seed=args.seed, max_tokens=args.n_predict, ignore_eos=args.ignore_eos)


def load_engine(cfg: ModelConfig, quiet: bool = False):
    """Print the devices llama.cpp sees, load target and draft, run the pairing check (a refused draft: exit
    status 2), print its warnings, where the layers went (a build that can offload) and the memory summary."""
    from ..backends.devices import devices_line, gpu_offload, list_devices, placement
    from ..loading import PairingRefused, load_checked

    if not quiet:
        layers = {"-ngl": cfg.n_gpu_layers, **({"-ngld": cfg.n_gpu_layers_draft} if cfg.draft_path else {})}
        print(devices_line(list_devices(), gpu_offload(), layers), file=sys.stderr)
    try:
        engine, warnings = load_checked(cfg)
    except PairingRefused as e:
        raise CliError(str(e), 2) from None
    except (FileNotFoundError, ValueError, MemoryError) as e:
        raise CliError(str(e)) from None
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    check = getattr(engine.target, "exact_check", None)
    if check is not None and not check.exact:
        print(f"warning: --exact: {check.detail}", file=sys.stderr)
    elif check is not None and not quiet:
        print(f"exact: {check.detail}", file=sys.stderr)
    if not quiet:
        from ..memory import loaded_summary

        if gpu_offload():
            where = [placement(role, m.load_log) for role, m in (("target", engine.target), ("draft", engine.draft))
                     if m is not None and getattr(m, "load_log", None)]
            if any(where):
                print("layers: " + "; ".join(w for w in where if w), file=sys.stderr)
        print(loaded_summary(engine), file=sys.stderr)
    return engine
