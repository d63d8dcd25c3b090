"""Acceptance and speed of the draft model against its cache window (--draft-ctx), in-process.

    python -m specserve.measure.draft_window --workload long-file --prompts 4 -n 64 --windows 128,256,512,1024,0
    python -m specserve.measure.draft_window ... --speed draft,auto   # and generation with the target, interleaved

Acceptance needs no target pass: greedy output is the target's own text whatever the draft, so each
prompt's continuation is generated once (with prompt lookup: the same text, sooner), and the draft
model then drafts against it as `--spec draft --draft-max K` does: K tokens from its window, kept while
they match the text, the sequence moving on by the kept tokens and the target's own next one. That is
noise-free; the draft's prefill and its time a step are measured too (noisy on a shared machine).

Variants (--variants): `shift` (a slide drops the oldest recent cells and moves the rest down:
llama.cpp's seq_rm + seq_add), `refill` (a slide evaluates the window again, as where the memory cannot
shift), `sinks=N` (N attention sinks instead of 4). `--speed MODES` also generates each prompt with the
target for every window and mode, configurations interleaved, and reports decode tokens/s and the time
to the first token (medians over prompts; paired ratios to the full-context draft).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter

from .. import models, steps
from ..backends import load_model
from ..bench.workloads import load_workload
from ..config import UBATCH_DRAFT_DEFAULT, SamplingParams, SpecParams
from ..drafters.draft_model import DraftModelDrafter
from ..drafters.window import N_SINK, WindowedContext, draft_contexts
from ..engine import Engine
from ..prompt import chat_tokens
from ..sampling import Sampler


def _window(draft, n_ctx: int, cells: int, variant: str):
    """A fresh draft cache: `cells` of them (0: n_ctx) under the variant."""
    ctx = draft_contexts(draft, n_ctx, cells, n_ubatch=UBATCH_DRAFT_DEFAULT)[0]  # as the engine makes it
    if isinstance(ctx, WindowedContext):
        if variant == "refill":
            ctx.inner.drop = lambda start, n: False  # as a memory that cannot shift: the window is filled again
        elif variant.startswith("sinks="):
            ctx.n_sink = int(variant[6:])
    return ctx


def simulate(draft, ctx, prompt: list[int], text: list[int], k: int) -> dict:
    """`--spec draft` against the target's known greedy `text` after `prompt`, from a cold cache."""
    drafter = DraftModelDrafter(draft, ctx)
    sampler = Sampler(SamplingParams())
    t = time.perf_counter()
    steps.direct(drafter.prefill_steps(prompt))
    prefill_s = time.perf_counter() - t
    prefilled = len(getattr(ctx, "inner", ctx).tokens)
    seq, done, drafted, accepted, n_steps, draft_s = list(prompt), 0, 0, 0, 0, 0.0
    while done < len(text):
        t = time.perf_counter()
        tokens = drafter.propose(seq, min(k, len(text) - done), sampler).tokens
        draft_s += time.perf_counter() - t
        n = next((i for i, x in enumerate(tokens) if x != text[done + i]), len(tokens))
        drafted, accepted, n_steps = drafted + len(tokens), accepted + n, n_steps + 1
        seq += text[done:done + n + 1]
        done += n + 1
    return {"drafted": drafted, "accepted": accepted, "steps": n_steps, "prefill_tokens": prefilled,
            "prefill_s": prefill_s, "draft_s": draft_s}


def _speed(engines: dict, prompts, modes: list[str], n: int, k: int) -> dict:
    """(window, mode) -> per-prompt decode tokens/s and time to first token, configurations interleaved."""
    out: dict = {}
    configs = [(w, m) for w in engines for m in modes]
    for i, prompt in enumerate(prompts):
        shift = i % len(configs)
        for w, mode in configs[shift:] + configs[:shift]:
            slot = engines[w]
            slot.forget_cache()
            g = slot.generate(prompt, SamplingParams(max_tokens=n, ignore_eos=True), SpecParams(mode=mode, draft_max=k))
            s = g.stats
            row = out.setdefault((w, mode), {"tps": [], "ttft": [], "accepted": 0, "drafted": 0, "steps": Counter()})
            row["tps"].append((s.n_generated - 1) / max(s.t_total - s.t_first_token, 1e-9))
            row["ttft"].append(s.t_first_token)
            row["accepted"] += s.n_accepted
            row["drafted"] += s.n_drafted
            row["steps"].update(s.drafter_steps)  # auto: which drafters it used (the hybrid where lookups match)
            print(f"  speed prompt {i + 1} window {w or 'full'} {mode}: {row['tps'][-1]:.2f} tok/s, "
                  f"first token {s.t_first_token:.2f} s", file=sys.stderr, flush=True)
    return out


def _target_texts(target, draft, prompts: list[list[int]], args) -> list[list[int]]:
    """The target's greedy text after each prompt (from --texts where it holds them for these prompts)."""
    key = {"target": target.path, "prompts": prompts, "n": args.n}
    if args.texts and os.path.exists(args.texts):
        with open(args.texts) as f:
            kept = json.load(f)
        if {k: kept.get(k) for k in key} == key:
            return kept["texts"]
    slot = Engine(target, draft, args.ctx_size).new_slot()
    texts = []
    for i, prompt in enumerate(prompts):
        g = slot.generate(prompt, SamplingParams(max_tokens=args.n, ignore_eos=True), SpecParams(mode="ngram"))
        texts.append(g.tokens)
        print(f"prompt {i + 1}: {len(prompt)} tokens, the target's text: {len(g.tokens)} tokens", file=sys.stderr)
    slot.close()
    if args.texts:
        with open(args.texts, "w") as f:
            json.dump({**key, "texts": texts}, f)
    return texts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specserve.measure.draft_window", description=__doc__.split("\n")[0])
    p.add_argument("-m", "--model", default="qwen2.5-coder-1.5b-f16", help="target (default: the reference pair's)")
    p.add_argument("-md", "--model-draft", default="qwen2.5-coder-0.5b", help="draft model")
    p.add_argument("--workload", default="long-file", help="bench workload (default long-file)")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("-n", type=int, default=64, help="tokens generated a prompt (default 64)")
    p.add_argument("-k", "--draft-max", type=int, default=8)
    p.add_argument("-c", "--ctx-size", type=int, default=4096)
    p.add_argument("-t", "--threads", type=int, default=None)
    p.add_argument("--windows", default="128,256,512,1024,0", help="draft windows, 0: the whole context")
    p.add_argument("--variants", default="shift", help="comma list of shift, refill, sinks=N (default shift)")
    p.add_argument("--speed", default="", metavar="MODES", help="also generate with the target: --spec modes")
    p.add_argument("--no-accept", action="store_true", help="skip the acceptance runs (with --speed)")
    p.add_argument("--json", metavar="OUT")
    p.add_argument("--texts", metavar="FILE", help="keep the target's texts here (JSON): read if it exists, written "
                   "otherwise, so that another run over the same prompts needs no target pass")
    args = p.parse_args(argv)
    windows = [int(w) for w in args.windows.split(",")]
    variants = args.variants.split(",")
    target = load_model(str(models.resolve(args.model)), n_threads=args.threads)
    draft = load_model(str(models.resolve(args.model_draft)), n_threads=args.threads)
    prompts = [chat_tokens(target, list(bp.messages)) for bp in load_workload(args.workload, args.prompts)
               if not bp.answers_needed]
    texts = _target_texts(target, draft, prompts, args)
    rows = []
    for w in windows if not args.no_accept else []:
        for variant in variants if w else ["full"]:
            total: dict = {}
            each = []
            for prompt, text in zip(prompts, texts):
                ctx = _window(draft, args.ctx_size, w, variant)
                got = simulate(draft, ctx, prompt, text, args.draft_max)
                each.append(round(got["accepted"] / max(got["drafted"], 1), 3))
                for key, v in got.items():
                    total[key] = total.get(key, 0) + v
                ctx.close()
            rows.append({"window": w, "variant": variant, **total, "per_prompt": each,
                         "acceptance": total["accepted"] / max(total["drafted"], 1),
                         "tau": 1 + total["accepted"] / max(total["steps"], 1)})
            print(f"window {w or 'full':>5} {variant:<8} acceptance {rows[-1]['acceptance']:.3f} tau "
                  f"{rows[-1]['tau']:.2f} prefill {total['prefill_tokens']} tok {total['prefill_s']:.1f} s "
                  f"draft {1000 * total['draft_s'] / total['steps']:.0f} ms/step; by prompt {each}", flush=True)
    speed = {}
    if args.speed:
        engines = {}
        for w in windows:
            engine = Engine(target, draft, args.ctx_size)
            engine.draft_window = w
            engines[w] = engine.new_slot()
        got = _speed(engines, prompts, args.speed.split(","), args.n, args.draft_max)
        for (w, mode), r in got.items():
            full = got.get((0, mode))
            ratio = statistics.median(a / b for a, b in zip(r["tps"], full["tps"])) if full else None
            speed[f"{w}/{mode}"] = {"tokens_per_s": statistics.median(r["tps"]), "ttft_s": statistics.median(r["ttft"]),
                                    "vs_full": ratio, "acceptance": r["accepted"] / max(r["drafted"], 1),
                                    "drafter_steps": dict(r["steps"])}
            print(f"window {w or 'full':>5} {mode:<6} decode {speed[f'{w}/{mode}']['tokens_per_s']:.2f} tok/s "
                  f"(x{ratio or 0:.3f} the full draft's) first token {speed[f'{w}/{mode}']['ttft_s']:.2f} s, "
                  f"drafters {dict(r['steps'])}")
        for slot in engines.values():
            slot.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "n_sink": N_SINK, "prompt_tokens": [len(p) for p in prompts],
                       "acceptance": rows, "speed": speed}, f, indent=1)
    target.close()
    draft.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
