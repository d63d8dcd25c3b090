"""`specserve export vllm`: the chosen speculative settings as vLLM's `--speculative-config`.

The settings come from flags (--spec, --draft-max, ...) or from a `specserve bench --json`
report's recommendation (--from-bench). vLLM loads Hugging Face checkpoints, not GGUF
files, so the draft model's repository is taken from --hf-draft, else from the packaged
model's `hf_repo`, else the GGUF's file name is left for the user to replace (and said so).
The JSON goes to stdout (ready for `--speculative-config "$(specserve export vllm ...)"`);
what does not carry over goes to stderr, one line each.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..config import SUFFIX_MAX_DEFAULT
from .common import CliError

# specserve's packaged GGUFs and the Hugging Face checkpoints vLLM would load for them.
HF_REPOS = {
    "qwen2.5-coder-0.5b": "Qwen/Qwen2.5-Coder-0.5B-Instruct",
    "qwen2.5-coder-1.5b": "Qwen/Qwen2.5-Coder-1.5B-Instruct",
    "qwen2.5-coder-1.5b-f16": "Qwen/Qwen2.5-Coder-1.5B-Instruct",
    "smollm2-f16": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "smollm2-q4_1": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "gemma": "google/gemma-3-270m-it",
}
AUTO_FALLBACK = "ngram"  # what --spec auto exports as: vLLM has no per-step choice between drafters


@dataclass
class Export:
    """vLLM's speculative config and the notes on what it leaves out."""

    config: dict | None
    notes: list[str] = field(default_factory=list)


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="export chosen settings for another serving engine (vLLM)",
                       description="Turn chosen speculative settings, or a `specserve bench --json` "
                                   "recommendation, into another engine's configuration.")
    what = p.add_subparsers(dest="target_engine", metavar="ENGINE", required=True)
    v = what.add_parser("vllm", help="vLLM's --speculative-config JSON",
                        description="Print vLLM's --speculative-config JSON for the given settings; notes on what "
                                    "does not carry over go to stderr.")
    v.add_argument("--from-bench", metavar="REPORT.json",
                   help="take spec, draft model and draft length from this `specserve bench --json` report's "
                        "recommendation (flags below override it)")
    v.add_argument("--spec", choices=("draft", "ngram", "suffix", "auto", "none"), default=None,
                   help="the drafter (default: the report's, else draft)")
    v.add_argument("-md", "--model-draft", metavar="DRAFT",
                   help="the draft model: packaged name, GGUF path or Hugging Face repo (default: the report's, "
                        "else the qwen pair's draft)")
    v.add_argument("--hf-draft", metavar="REPO", help="the draft's Hugging Face repository, as vLLM loads it")
    v.add_argument("--draft-max", type=int, default=None, metavar="N",
                   help="num_speculative_tokens (default: the report's, else 8; 32 for suffix)")
    v.add_argument("--ngram-min", type=int, default=1, metavar="N", help="prompt_lookup_min (default 1)")
    v.add_argument("--ngram-max", type=int, default=4, metavar="N", help="prompt_lookup_max (default 4)")
    v.add_argument("--suffix-tree-depth", type=int, default=24, metavar="N",
                   help="suffix_decoding_max_tree_depth (default 24, vLLM's)")
    v.add_argument("--no-cross-request", action="store_true",
                   help="suffix: no store of earlier requests (suffix_decoding_max_cached_requests = 0)")
    v.add_argument("--command", metavar="TARGET_REPO", nargs="?", const="",
                   help="print a whole `vllm serve TARGET_REPO --speculative-config ...` line instead (TARGET_REPO "
                        "defaults to the report's target, mapped to its Hugging Face repository)")
    p.set_defaults(run=run)


def _hf_repo(model: str | None, given: str | None, notes: list[str], role: str) -> str | None:
    if given:
        return given
    if model is None:
        return None
    stem = Path(model).name.removesuffix(".gguf")
    for name, repo in HF_REPOS.items():
        if stem == name or stem.lower().startswith(repo.split("/")[1].lower()):
            return repo
    if "/" in model and not model.endswith(".gguf") and not Path(model).exists():
        return model  # already a repository name
    notes.append(f"the {role} {model!r} is a GGUF file; vLLM needs its Hugging Face checkpoint: replace "
                 f"the name (or pass --hf-{role})")
    return stem


def vllm_config(spec: str, draft_model: str | None = None, draft_max: int | None = None, ngram_min: int = 1,
                ngram_max: int = 4, suffix_tree_depth: int = 24, cross_request: bool = True,
                hf_draft: str | None = None) -> Export:
    """vLLM's speculative config for specserve's settings, and notes on what does not carry over."""
    notes = ["vLLM verifies with rejection sampling (specserve's --verify rejection, and its default for a "
             "request without a seed); gumbel, which keeps the text for a seed whatever is drafted (specserve's "
             "default for a request with one), has no vLLM counterpart"]
    if spec == "auto":
        notes.append(f"--spec auto picks drafter and length per step; vLLM has one method per server: exported as "
                     f"{AUTO_FALLBACK} (bench the draft model and suffix exports too, with specserve bench --endpoint)")
        spec = AUTO_FALLBACK
    if spec == "none":
        return Export(None, notes + ["--spec none: run vLLM without --speculative-config"])
    if draft_max is not None and not 1 <= draft_max <= 64:
        raise ValueError(f"--draft-max must be in [1, 64], got {draft_max}")
    if spec == "draft":
        repo = _hf_repo(draft_model, hf_draft, notes, "draft")
        if repo is None:
            raise ValueError("--spec draft needs a draft model (-md or --hf-draft)")
        notes.append("--draft-p-min/--draft-min (stop drafting below a probability) have no vLLM counterpart; "
                     "the draft runs in vLLM's own precision, not the GGUF's quantisation: acceptance can differ")
        return Export({"method": "draft_model", "model": repo, "num_speculative_tokens": draft_max or 8}, notes)
    if spec == "ngram":
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError(f"need 1 <= --ngram-min <= --ngram-max, got {ngram_min}, {ngram_max}")
        return Export({"method": "ngram", "num_speculative_tokens": draft_max or 8,
                       "prompt_lookup_max": ngram_max, "prompt_lookup_min": ngram_min}, notes)
    if spec == "suffix":
        cfg = {"method": "suffix", "num_speculative_tokens": draft_max or 32,
               "suffix_decoding_max_tree_depth": suffix_tree_depth}
        if not cross_request:
            cfg["suffix_decoding_max_cached_requests"] = 0
        notes.append(f"specserve's suffix cap is {SUFFIX_MAX_DEFAULT} tokens by default, vLLM suggests 16-32; "
                     "its store of earlier requests is sized in MiB (--cross-request-mib), vLLM's in requests "
                     "(suffix_decoding_max_cached_requests) or tokens; cross_request_scope (which requests may "
                     "see each other's text) does not carry over: vLLM's store is one per server")
        return Export(cfg, notes)
    raise ValueError(f"unknown --spec {spec!r}")


def _from_bench(path: str) -> dict:
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
        rec = report["recommendation"]
        return {"spec": rec["spec"], "draft_model": rec.get("draft_model"), "draft_max": rec.get("draft_max"),
                "target": report.get("settings", {}).get("target")}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CliError(f"--from-bench {path}: not a `specserve bench --json` report ({e})", 2) from None


def run(args) -> int:
    from ..models import PAIRS

    chosen = _from_bench(args.from_bench) if args.from_bench else {}
    spec = args.spec or chosen.get("spec") or "draft"
    draft = args.model_draft or chosen.get("draft_model") or PAIRS["qwen"][1]
    try:
        out = vllm_config(spec, draft, args.draft_max or chosen.get("draft_max"), args.ngram_min, args.ngram_max,
                          args.suffix_tree_depth, not args.no_cross_request, args.hf_draft)
    except ValueError as e:
        raise CliError(str(e), 2) from None
    for note in out.notes:
        print(f"note: {note}", file=sys.stderr)
    text = json.dumps(out.config) if out.config is not None else ""
    if args.command is not None:
        target = _hf_repo(args.command or chosen.get("target") or PAIRS["qwen"][0], None, [], "target")
        print(f"vllm serve {target}" + (f" --speculative-config '{text}'" if text else ""))
    elif text:
        print(text)
    return 0
