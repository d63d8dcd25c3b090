"""Hot-path measurements (issue 12), run by hand.

    python -m specserve.measure.perf_hotpath speed   -m TARGET [-n 64] [--repeat 5]
        The target alone, greedy against sampled (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05)
        on the same prompt, runs interleaved after a warm-up: median tokens/s of each and their ratio.
    python -m specserve.measure.perf_hotpath profile -m TARGET [-md DRAFT] [--spec ...] [--temp 0.8] [-n 64]
        Where a decoding step's time goes: llama_decode of the target and of the draft (timed by
        wrapping llama_cpp.llama_decode), the verifier, the drafter's own Python, the rest.
    python -m specserve.measure.perf_hotpath micro   -m TARGET -md DRAFT
        The Python per token and per step, on real logits recorded once, each timed as the minimum
        over many repeats (so it holds on a busy machine): selecting a token from one row (target
        alone), and a k = 4 step: the draft model's draws and the verification of 5 rows.
    python -m specserve.measure.perf_hotpath host    -m TARGET -md DRAFT [-k 8] [-n 64] [--repeat 7] [--logprobs 5]
                                                     [--spec auto draft]
        The host work of a draft-model step at k tokens (issue 64's budget: 1 ms greedy, 2 ms sampled at
        k = 8 with a 152k vocabulary): everything the engine does besides llama_decode, split by part
        (host_step.py), greedy and sampled (as speed's; verified by gumbel and by rejection), as the CPU
        time of the decoding thread per step, min and median over --repeat replays of one recorded run.
    python -m specserve.measure.perf_hotpath accept  -m TARGET -md DRAFT [--temp ...] [--prompts 6] [-n 64] [--engine]
        The draft model's acceptance under --verify gumbel and rejection, per position on the target's
        own sampled continuations (rejection: 1 - TV exactly; gumbel: the coupling's probability by
        Monte Carlo over the noise, and its bound (1 - TV) / (1 + TV)); with --engine also as the
        engine measures it drafting k tokens a step. Acceptance does not depend on the machine's load.

Works against older trees too (speed, profile): run this file as a script with PYTHONPATH at their src
(`PYTHONPATH=OLD/src python3 src/specserve/measure/perf_hotpath.py speed ...`); it imports specserve by
absolute name for that. Before the tools package it lived at tests/perf_hotpath.py. --json OUT writes
everything. Timings are only as good as the machine is quiet (llama.cpp threads spin on shared cores).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict

import numpy as np

from specserve.backends import load_model
from specserve.config import SamplingParams, SpecParams
from specserve.engine import Engine

PROMPT = ("Write a short story about a lighthouse keeper who finds a message in a bottle. "
          "Describe the sea, the weather and what the message says.")
SAMPLED = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)


def chat(model, text: str) -> list[int]:
    from specserve.prompt import prompt_tokens

    return prompt_tokens(model, text, chat=True)


def generate(slot, prompt, params, spec, verify=None):
    args = (prompt, params, spec) if verify is None else (prompt, params, spec, verify)
    return slot.generate(*args)


# --- speed ---------------------------------------------------------------------------------------


def speed(args) -> dict:
    target = load_model(args.model, n_threads=args.threads)
    slot = Engine(target, None, n_ctx=2048).new_slot()
    prompt = chat(target, PROMPT)
    configs = {"greedy": SamplingParams(max_tokens=args.n, ignore_eos=True),
               "sampled": SamplingParams(seed=1, max_tokens=args.n, ignore_eos=True, **SAMPLED)}
    spec = SpecParams(mode="none")
    for params in configs.values():  # warm-up
        generate(slot, prompt, SamplingParams(max_tokens=8, temperature=params.temperature, seed=1), spec)
    rates = defaultdict(list)
    for r in range(args.repeat):
        for name in (list(configs) if r % 2 == 0 else list(configs)[::-1]):
            slot.forget_cache()
            g = generate(slot, prompt, configs[name], spec)
            rates[name].append(g.stats.tokens_per_s)
    out = {name: {"median_tokens_per_s": statistics.median(v), "runs": v} for name, v in rates.items()}
    ratios = [s / g for s, g in zip(rates["sampled"], rates["greedy"])]
    out["sampled_over_greedy"] = {"median": statistics.median(ratios), "runs": ratios}
    print(f"target alone, {args.n} tokens x {args.repeat}: greedy {out['greedy']['median_tokens_per_s']:.2f} tok/s, "
          f"sampled {out['sampled']['median_tokens_per_s']:.2f} tok/s, "
          f"ratio {out['sampled_over_greedy']['median']:.3f}")
    return out


# --- profile -------------------------------------------------------------------------------------


class Timers:
    """Wraps functions by module and name, accumulating their wall time; llama_decode by context."""

    def __init__(self):
        self.t = defaultdict(float)
        self.restore = []

    def wrap(self, owner, name: str, key: str) -> None:
        fn = getattr(owner, name, None)
        if fn is None:
            return
        timers = self

        def timed(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                timers.t[key] += time.perf_counter() - t0

        setattr(owner, name, timed)
        self.restore.append((owner, name, fn))

    def wrap_decode(self, names: dict[int, str]) -> None:
        import llama_cpp

        fn, timers = llama_cpp.llama_decode, self

        def timed(ctx, batch):
            t0 = time.perf_counter()
            try:
                return fn(ctx, batch)
            finally:
                timers.t["forward " + names.get(ctx if isinstance(ctx, int) else getattr(ctx, "value", ctx), "?")] \
                    += time.perf_counter() - t0

        llama_cpp.llama_decode = timed
        self.restore.append((llama_cpp, "llama_decode", fn))

    def undo(self) -> None:
        for owner, name, fn in reversed(self.restore):
            setattr(owner, name, fn)
        self.restore.clear()


def profile(args) -> dict:
    import specserve.drafters.draft_model as dm
    import specserve.drafters.ngram as ng
    import specserve.slot as slot_module
    import specserve.text as text

    target = load_model(args.model, n_threads=args.threads)
    draft = load_model(args.model_draft, n_threads=args.threads) if args.model_draft else None
    engine = Engine(target, draft, n_ctx=2048)
    slot = engine.new_slot()
    prompt = chat(target, PROMPT)
    out = {}
    for mode in args.spec or ["none", "ngram", "draft"]:
        if mode == "draft" and draft is None:
            continue
        params = SamplingParams(seed=1, max_tokens=args.n, ignore_eos=True, **{**SAMPLED, "temperature": args.temp})
        spec = SpecParams(mode=mode, draft_max=args.draft_max)
        generate(slot, prompt, SamplingParams(max_tokens=8), spec)  # warm-up
        timers = Timers()
        names = {slot.ctx._ctx if isinstance(slot.ctx._ctx, int) else slot.ctx._ctx.value: "target"}
        if slot.draft_ctx is not None:
            d = getattr(slot.draft_ctx, "inner", slot.draft_ctx)._ctx  # a --draft-ctx window: its cells
            names[d if isinstance(d, int) else d.value] = "draft"
        timers.wrap_decode(names)
        timers.wrap(slot_module, "verify", "verify (Python)")
        timers.wrap(dm.DraftModelDrafter, "propose", "draft model propose")
        timers.wrap(ng.NgramDrafter, "propose", "ngram propose")
        timers.wrap(text.StreamDecoder, "push", "detokenize + stop strings")
        slot.forget_cache()
        try:
            g = generate(slot, prompt, params, spec)
        finally:
            timers.undo()
        s = g.stats
        decode = s.t_total - s.t_prompt  # the target's prompt is not a step
        t = dict(timers.t)
        # forward passes while decoding: the target's after its prompt (t_prompt), the draft's all
        forward = t.get("forward target", 0.0) - s.t_prompt + t.get("forward draft", 0.0)
        row = {"steps": s.n_passes, "tokens": s.n_generated, "decode_s": decode, "tokens_per_s": s.tokens_per_s,
               "acceptance": s.acceptance, "per_step_ms": {}}
        prefill = getattr(s, "t_prompt_draft", 0.0)  # the draft model's prompt, in one batch before the steps
        row["per_step_ms"]["forward target"] = 1000 * (t.get("forward target", 0.0) - s.t_prompt) / s.n_passes
        row["per_step_ms"]["forward draft"] = 1000 * (t.get("forward draft", 0.0) - prefill) / s.n_passes
        row["per_step_ms"]["draft prompt (once, per step)"] = 1000 * prefill / s.n_passes
        row["per_step_ms"]["verify (Python)"] = 1000 * t.get("verify (Python)", 0.0) / s.n_passes
        propose = t.get("draft model propose", 0.0) + t.get("ngram propose", 0.0)
        row["per_step_ms"]["drafter Python"] = 1000 * (propose - t.get("forward draft", 0.0) + prefill) / s.n_passes
        row["per_step_ms"]["detokenize + stop strings"] = 1000 * t.get("detokenize + stop strings", 0.0) / s.n_passes
        accounted = sum(row["per_step_ms"].values()) / 1000 * s.n_passes
        row["per_step_ms"]["other (engine, policy)"] = 1000 * (decode - accounted) / s.n_passes
        row["python_share"] = (decode - forward) / decode
        out[mode] = row
        print(f"--spec {mode} at temperature {args.temp}: {s.n_generated} tokens in {s.n_passes} steps, "
              f"{s.tokens_per_s:.2f} tok/s, acceptance {s.acceptance:.2f}; Python {100 * row['python_share']:.1f}% "
              "of decoding; per step (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in row["per_step_ms"].items()))
    return out


# --- micro: the Python of a token and of a step, load-independent ---------------------------------


def micro(args) -> dict:
    import timeit

    import specserve.sampling as sampling
    from specserve.verifier import verify

    new = hasattr(sampling, "Sampler")
    target = load_model(args.model, n_threads=args.threads)
    draft = load_model(args.model_draft, n_threads=args.threads)
    tokens = chat(target, PROMPT)
    rows = {}
    for name, model in (("p", target), ("q", draft)):
        ctx = model.new_context(len(tokens) + 8)
        rows[name] = ctx.eval(tokens, logits="all")[-5:].copy()  # [5, V]: a step's rows
        ctx.close()
    p5, q4 = rows["p"], rows["q"][:4]

    def best(fn, n=30) -> float:
        return 1e6 * min(timeit.repeat(fn, number=n, repeat=7)) / n  # microseconds

    out = {"tree": "new" if new else "old", "n_vocab": int(p5.shape[1])}
    for label, kw in (("greedy", dict(temperature=0.0)), ("sampled", dict(SAMPLED))):
        params = SamplingParams(seed=1, **kw)
        if new:
            sampler = sampling.Sampler(params, "rejection")
            one = best(lambda: verify([], None, p5[:1], sampler, 0))
            draws = best(lambda: [sampler.pick(q4[i], i) for i in range(4)])
            dists = [sampler.pick(q4[i], i)[1] for i in range(4)]
            x = [int(sampler.pick(q4[i], i)[0][0]) for i in range(4)]
            step = {m: best(lambda: verify(x, None if params.greedy else dists, p5, sampling.Sampler(params, m), 0))
                    for m in ("gumbel", "rejection")}
        else:
            rng = np.random.default_rng(1)
            one = best(lambda: verify([], None, p5[:1], params, rng))
            if params.greedy:
                draws = best(lambda: [int(np.argmax(q4[i])) for i in range(4)])
                probs, x = None, [int(np.argmax(q4[i])) for i in range(4)]
            else:
                draws = best(lambda: np.stack([sampling.process(q4[i], params) for i in range(4)]))
                probs = np.stack([sampling.process(q4[i], params) for i in range(4)])
                x = [sampling.sample(probs[i], rng) for i in range(4)]
            step = {"rejection": best(lambda: verify(x, probs, p5, params, rng))}
        out[label] = {"token_us": one, "draft_4_draws_us": draws, "verify_5_rows_us": step}
        print(f"{out['tree']} tree, {label}: a token from one row {one:.0f} us; "
              f"a k=4 step: draft draws {draws:.0f} us, verification of 5 rows "
              + ", ".join(f"{m} {v:.0f} us" for m, v in step.items()))
    return out


# --- host: the engine's own work per step, without the forward passes ---------------------------------


def host(args) -> dict:
    from specserve.measure import host_step

    target = load_model(args.model, n_threads=args.threads)
    draft = load_model(args.model_draft, n_threads=args.threads)
    slot = Engine(target, draft, n_ctx=2048).new_slot()
    prompt = chat(target, PROMPT)
    configs = (("greedy", SamplingParams(seed=1, max_tokens=args.n, ignore_eos=True), "gumbel"),
               ("sampled, gumbel", SamplingParams(seed=1, max_tokens=args.n, ignore_eos=True, **SAMPLED), "gumbel"),
               ("sampled, rejection", SamplingParams(seed=1, max_tokens=args.n, ignore_eos=True, **SAMPLED),
                "rejection"))
    out = {"k": args.k, "n_vocab": target.vocab.n_vocab, "repeat": args.repeat}
    variants = (None,) + ((args.logprobs,) if args.logprobs is not None else ())
    for mode, (label, params, method) in ((m, c) for m in args.spec or ["auto"] for c in configs):
        label = f"--spec {mode}, {label}"
        out[label] = host_step.measure(slot, prompt, params, method, args.k, args.repeat, variants, mode)
        for variant, row in out[label].items():
            ms = row["ms"]
            print(f"{label} ({variant}), k={args.k}, {row['steps']} steps: host {ms['total']['min']:.3f} ms/step "
                  f"(median {ms['total']['median']:.3f}); min per part: "
                  + ", ".join(f"{p} {ms[p]['min']:.3f}" for p in host_step.PARTS), flush=True)
    return out


# --- acceptance ------------------------------------------------------------------------------------


def _head(p: np.ndarray, mass: float = 1 - 1e-4) -> np.ndarray:
    """The ids of the most likely tokens of p that together hold `mass`."""
    order = np.argsort(-p)
    return order[: int(np.searchsorted(np.cumsum(p[order]), mass)) + 1]


def accept(args) -> dict:
    from specserve.bench.workloads import load_workload
    from specserve.prompt import chat_tokens
    from specserve.sampling import candidates

    target = load_model(args.model, n_threads=args.threads)
    draft = load_model(args.model_draft, n_threads=args.threads)
    slot = Engine(target, draft, n_ctx=2048).new_slot()
    prompts = [chat_tokens(target, list(p.messages)) for p in load_workload(args.workload, args.prompts)]
    rng = np.random.default_rng(0)
    settings = (("temperature only", {}), ("top-k 40, top-p 0.95, min-p 0.05",
                                            {k: v for k, v in SAMPLED.items() if k != "temperature"}))
    out = {}
    for temp in args.temp:
        contexts = []  # (target rows, draft rows) on the target's own continuation at this temperature
        for i, prompt in enumerate(prompts):
            cont = slot.generate(prompt, SamplingParams(temperature=temp, seed=i, max_tokens=args.n),
                                 SpecParams(mode="none")).tokens
            seq, rows = prompt + cont, []
            for model in (target, draft):
                ctx = model.new_context(len(seq) + 8)
                ctx.eval(seq[: len(prompt) - 1])
                rows.append(ctx.eval(seq[len(prompt) - 1 : -1], logits="all").copy())  # [len(cont), V]
                ctx.close()
            contexts.append(rows)
        for label, extra in settings:
            params = SamplingParams(temperature=temp, **extra)
            tv, gum, bound = [], [], []
            for p_rows, q_rows in contexts:
                p_all, q_all = candidates(p_rows, params), candidates(q_rows, params)
                for j in range(len(p_rows)):
                    p_d, q_d = p_all.dense(j, p_rows.shape[1]), q_all.dense(j, q_rows.shape[1])
                    n = min(len(p_d), len(q_d))  # (a padded pair: mass beyond the common ids counts in TV only)
                    d = 0.5 * (np.abs(p_d[:n] - q_d[:n]).sum() + p_d[n:].sum() + q_d[n:].sum())
                    # the coupling by Monte Carlo, on the tokens holding all but ~1e-4 of either's mass
                    ids = np.union1d(_head(p_d[:n]), _head(q_d[:n]))
                    g = rng.gumbel(size=(2000, len(ids)))
                    with np.errstate(divide="ignore"):
                        same = np.argmax(np.log(p_d[ids]) + g, axis=1) == np.argmax(np.log(q_d[ids]) + g, axis=1)
                    tv.append(d)
                    gum.append(float(same.mean()))
                    bound.append((1 - d) / (1 + d))
            row = {"positions": len(tv), "mean_tv": float(np.mean(tv)),
                   "per_position_rejection": 1 - float(np.mean(tv)),
                   "per_position_gumbel": float(np.mean(gum)), "per_position_gumbel_bound": float(np.mean(bound))}
            if args.engine:
                row["engine"] = {}
                for method in ("gumbel", "rejection"):
                    drafted = accepted = 0
                    for i, prompt in enumerate(prompts):
                        g = slot.generate(prompt, SamplingParams(temperature=temp, seed=100 + i, max_tokens=args.n,
                                                                 **extra), SpecParams(mode="draft", draft_max=args.k),
                                          method)
                        drafted, accepted = drafted + g.stats.n_drafted, accepted + g.stats.n_accepted
                    row["engine"][method] = {"drafted": drafted, "accepted": accepted, "acceptance": accepted / drafted}
            out[f"{temp} {label}"] = row
            line = (f"T={temp} ({label}), {len(tv)} positions: mean TV {row['mean_tv']:.3f}; acceptance per position: "
                    f"rejection {row['per_position_rejection']:.3f}, gumbel {row['per_position_gumbel']:.3f} "
                    f"(bound {row['per_position_gumbel_bound']:.3f})")
            if args.engine:
                e = row["engine"]
                line += (f"; engine, k={args.k}: rejection {e['rejection']['acceptance']:.3f}, "
                         f"gumbel {e['gumbel']['acceptance']:.3f}")
            print(line, flush=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("speed", "profile", "micro", "host", "accept"))
    p.add_argument("-m", "--model", required=True)
    p.add_argument("-md", "--model-draft")
    p.add_argument("-n", type=int, default=64)
    p.add_argument("-t", "--threads", type=int, default=None)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--spec", nargs="+", default=None, help="profile: default none ngram draft; "
                   "host: auto (the draft model pinned at k, its controller asked) and/or draft (default auto)")
    p.add_argument("--draft-max", type=int, default=4)
    p.add_argument("--temp", type=float, nargs="+", default=None)
    p.add_argument("--prompts", type=int, default=6)
    p.add_argument("-k", type=int, default=None, help="draft length: the engine's acceptance (accept, default 4), "
                   "the step measured (host, default 8)")
    p.add_argument("--logprobs", type=int, default=None, help="host: also replay with this many top logprobs")
    p.add_argument("--engine", action="store_true", help="accept: also run the engine with --spec draft")
    p.add_argument("--workload", default="spec-bench", help="accept: the prompts (default spec-bench)")
    p.add_argument("--json")
    args = p.parse_args()
    from specserve import models

    args.model = str(models.resolve(args.model))
    args.model_draft = str(models.resolve(args.model_draft)) if args.model_draft else None
    if args.what == "profile":
        args.temp = (args.temp or [0.8])[0]
        result = profile(args)
    elif args.what == "micro":
        result = micro(args)
    elif args.what == "host":
        args.k = args.k or 8
        result = host(args)
    elif args.what == "accept":
        args.temp = args.temp or [0.7, 0.8]
        args.k = args.k or 4
        result = accept(args)
    else:
        result = speed(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "result": result}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
