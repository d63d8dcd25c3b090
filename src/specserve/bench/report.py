"""Benchmark results: medians, paired speedups, ranking, the recommendation, the JSON report.

Speed is tokens/s per run after the target's prompt (the bench's own runs: a draft model's prompt and
the first step included; an --endpoint's: from its first token). Repeats of one prompt are reduced to their
median first, so each prompt counts once. A configuration's speedup is paired: for every prompt, its tokens/s
over the target alone's on that same prompt, then the geometric mean of those ratios (the median is reported
beside it). The target alone is 1 by construction. Configurations are ranked by that speedup, never by
acceptance: a draft that accepts more but costs more per step loses. Beside it, `speedup_e2e` pairs the
tokens/s to the last token (`e2e_tokens_per_s`), timed alike for every configuration and endpoint: what a
user waits for, every prompt's processing included. Multi-turn conversations are also reported by turn: the
first request against the later ones, which re-send or edit earlier answers (`summarize_turns`).
"""
from __future__ import annotations

import math
import os
import platform
import statistics
import sys
import time
from collections import Counter, defaultdict
from typing import Callable

from .runner import IN_PROCESS, BenchConfig, Measurement
from .structured import valid_share
from .workloads import TURN_KINDS

ALL = "all"
NOISE = 0.03  # paired gains below this are within run-to-run noise on a quiet machine


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else 0.0


def _add(into: list[int], values: list[int]) -> None:
    into.extend([0] * (len(values) - len(into)))
    for i, v in enumerate(values):
        into[i] += v


def _per_prompt(runs: list[Measurement], key: "str | Callable[[dict], float]") -> dict[tuple, float]:
    """(workload, temperature, prompt) -> median over repeats of stats[key] (or of key(stats))."""
    by_prompt: dict[tuple, list[float]] = defaultdict(list)
    for m in runs:
        value = key(m.stats) if callable(key) else float(m.stats.get(key) or 0.0)
        by_prompt[(m.workload, m.temperature, m.prompt_index)].append(value)
    return {k: statistics.median(v) for k, v in by_prompt.items()}


def e2e_tokens_per_s(stats: dict) -> float:
    """Tokens per second from sending the request (in-process: from taking the prompt) to its last token, on
    the client's clock: what a user waits for, the prompt's processing (a draft model's too) included. Timed
    alike for every configuration, the bench's own, served or in-process, and any --endpoint's."""
    t = float(stats.get("t_last_token_s") or stats.get("t_total_s") or 0.0)
    return stats.get("n_generated", 0) / t if t > 0 else 0.0


def summarize_config(config: BenchConfig, runs: list[Measurement], baseline: dict[tuple, float],
                     baseline_e2e: dict[tuple, float] | None = None) -> dict:
    """One configuration's results over `runs`, paired against the target alone's per-prompt tokens/s
    (and, given the baseline's, its tokens/s to the last token: `speedup_e2e`)."""
    tps = _per_prompt(runs, "tokens_per_s")
    ttft = _per_prompt(runs, "time_to_first_token_s")
    decode = _per_prompt(runs, "decode_tokens_per_s")
    ratios = [v / baseline[k] for k, v in tps.items() if v > 0 and baseline.get(k, 0) > 0]
    drafted, accepted, passes = (sum(m.stats.get(f, 0) for m in runs) for f in ("n_drafted", "n_accepted", "n_passes"))
    drafted_pos: list[int] = []
    accepted_pos: list[int] = []
    steps: Counter = Counter()
    for m in runs:
        _add(drafted_pos, m.stats.get("drafted_by_position", []))
        _add(accepted_pos, m.stats.get("accepted_by_position", []))
        steps.update(m.stats.get("drafter_steps", {}))
    local = config.spec != "endpoint"
    return {
        "name": config.name, "spec": config.spec, "draft_model": config.draft_model,
        "draft_max": config.draft_max, "endpoint": config.endpoint, "flags": config.flags, "via": config.via,
        "baseline": config.baseline,
        "n_prompts": len(tps), "n_runs": len(runs),
        "tokens_per_s": round(statistics.median(tps.values()), 2) if tps else 0.0,
        "speedup": round(_geomean(ratios), 4), "speedup_median": round(statistics.median(ratios), 4) if ratios else 0.0,
        "speedup_e2e": _e2e_speedup(runs, baseline_e2e) if baseline_e2e is not None else None,
        "speedup_min": round(min(ratios), 4) if ratios else 0.0,
        "speedup_max": round(max(ratios), 4) if ratios else 0.0,
        "acceptance": round(accepted / drafted, 4) if drafted else (0.0 if local else None),
        "mean_accepted_len": round(1 + accepted / passes, 4) if passes else (1.0 if local else None),
        "n_drafted": drafted, "n_accepted": accepted,
        "acceptance_by_position": [round(a / d, 4) if d else 0.0 for a, d in zip(accepted_pos, drafted_pos)],
        "drafter_steps": dict(steps),
        "ttft_s": round(statistics.median(ttft.values()), 4) if ttft else 0.0,
        # after the first token: what neither prompt processing (the target's nor a draft model's) enters
        "decode_tokens_per_s": round(statistics.median(decode.values()), 2) if decode else 0.0,
        "n_generated": sum(m.stats.get("n_generated", 0) for m in runs),
        "valid": valid_share([m.stats for m in runs]),  # share of schema-carrying outputs that validate
        "grammar_ms_per_token": _grammar_ms(runs),
        "grammar_share": _grammar_share(runs),
    }


def _e2e_speedup(runs: list[Measurement], baseline: dict[tuple, float]) -> float:
    """Geometric mean over prompts of tokens/s to the last token, over the baseline's on the same prompt."""
    e2e = _per_prompt(runs, e2e_tokens_per_s)
    ratios = [v / baseline[k] for k, v in e2e.items() if v > 0 and baseline.get(k, 0) > 0]
    return round(_geomean(ratios), 4)


def _grammar_ms(runs: list[Measurement]) -> float | None:
    """Grammar work (masks, matcher) per generated token over the runs that had any (in-process, or
    served by specserve: usage.speculative.grammar_s)."""
    t = sum(m.stats.get("t_grammar_s") or 0.0 for m in runs)
    n = sum(m.stats.get("n_generated", 0) for m in runs if m.stats.get("t_grammar_s"))
    return round(1000 * t / n, 4) if n else None


def _decode_s(stats: dict) -> float:
    """The engine's decode seconds of a run: the server's own where served, else total less prompt."""
    if "t_decode_server_s" in stats:
        return stats["t_decode_server_s"]
    return stats.get("t_total_s", 0.0) - stats.get("t_prompt_s", 0.0)


def _grammar_share(runs: list[Measurement]) -> float | None:
    """The grammar's share of the decode time of the runs that had any."""
    timed = [m.stats for m in runs if m.stats.get("t_grammar_s")]
    decode = sum(_decode_s(s) for s in timed)
    return round(sum(s["t_grammar_s"] for s in timed) / decode, 4) if decode > 0 else None


def summarize(configs: list[BenchConfig], results: list[Measurement], memory: dict) -> list[dict]:
    """Per configuration x (each workload and all workloads) x temperature, ranked within each group; a
    workload that ran at none of a temperature's prompts (`writing@0.8` at 0) has no group there."""
    temperatures = sorted({m.temperature for m in results})
    workloads = list(dict.fromkeys(m.workload for m in results))
    by_config = defaultdict(list)
    for m in results:
        by_config[m.config].append(m)
    entries = []
    for t in temperatures:
        for workload in [*workloads, ALL]:
            def keep(m: Measurement) -> bool:
                return m.temperature == t and workload in (ALL, m.workload)

            if not any(keep(m) for m in results):
                continue
            baselines = {b: _per_prompt([m for m in by_config[b] if keep(m)], "tokens_per_s")
                         for b in {c.baseline for c in configs}}
            e2e = {b: _per_prompt([m for m in by_config[b] if keep(m)], e2e_tokens_per_s)
                   for b in {c.baseline for c in configs}}
            group = [{**summarize_config(c, [m for m in by_config[c.name] if keep(m)], baselines[c.baseline],
                                         e2e[c.baseline]),
                      "workload": workload, "temperature": t, "memory_bytes": config_memory(c, memory)}
                     for c in configs]
            group.sort(key=lambda e: -e["speedup"])
            for rank, e in enumerate(group, 1):
                e["rank"] = rank
            entries += group
    return entries


def summarize_turns(configs: list[BenchConfig], results: list[Measurement]) -> list[dict]:
    """Each configuration on multi-turn prompts, by turn kind (first, retry, ...) and on all later turns
    ("later"), per temperature: paired speedup over the target alone on the same turns."""
    turned = [m for m in results if m.turn]
    entries = []
    for t in sorted({m.temperature for m in turned}):
        at_t = [m for m in turned if m.temperature == t]
        baselines = {b: _per_prompt([m for m in at_t if m.config == b], "tokens_per_s")
                     for b in {c.baseline for c in configs}}
        kinds = [k for k in TURN_KINDS if any(m.turn == k for m in at_t)]
        for c in configs:
            runs = [m for m in at_t if m.config == c.name]
            for kind in [*kinds, "later"]:
                picked = [m for m in runs if (m.turn != "first" if kind == "later" else m.turn == kind)]
                if not picked:
                    continue
                e = summarize_config(c, picked, baselines[c.baseline])
                entries.append({"name": c.name, "temperature": t, "turn": kind, "n_prompts": e["n_prompts"],
                                "tokens_per_s": e["tokens_per_s"], "speedup": e["speedup"],
                                "speedup_median": e["speedup_median"], "acceptance": e["acceptance"],
                                "mean_accepted_len": e["mean_accepted_len"], "n_drafted": e["n_drafted"]})
    return entries


def path_ratios(configs: list[BenchConfig], results: list[Measurement]) -> list[dict]:
    """For each configuration run both through the server and in-process: per temperature, the geometric
    mean over prompts of its served tok/s over its in-process tok/s on the same prompt (the server
    path's cost; 1 is none), with the lowest and highest single prompt."""
    names = {c.name for c in configs}
    twins = [c.name for c in configs if c.via == "server" and c.name + IN_PROCESS in names]
    out = []
    for t in sorted({m.temperature for m in results}):
        for name in twins:
            served, local = (_per_prompt([m for m in results if m.config == n and m.temperature == t], "tokens_per_s")
                             for n in (name, name + IN_PROCESS))
            ratios = [v / local[k] for k, v in served.items() if v > 0 and local.get(k, 0) > 0]
            if ratios:
                out.append({"name": name, "temperature": t, "n_prompts": len(ratios),
                            "ratio": round(_geomean(ratios), 4), "min": round(min(ratios), 4),
                            "max": round(max(ratios), 4)})
    return out


def config_memory(config: BenchConfig, memory: dict) -> int | None:
    """Bytes the configuration holds: the target and its caches, plus its draft model's, if any."""
    if config.spec == "endpoint" or "target" not in memory:
        return None
    total = memory["target"]["total_bytes"]
    if config.draft_model and config.spec in ("draft", "auto", "auto-fresh"):
        total += memory["drafts"][config.draft_model]["total_bytes"]
    return total


def recommend(configs: list[BenchConfig], results: list[Measurement], entries: list[dict]) -> dict:
    """The fastest local configuration over every prompt and temperature, with the reason."""
    baseline = _per_prompt([m for m in results if m.config == "target"], "tokens_per_s")
    local = [c for c in configs if c.spec != "endpoint"]
    overall = {c.name: summarize_config(c, [m for m in results if m.config == c.name], baseline) for c in local}
    ranked = sorted(overall.values(), key=lambda e: -e["speedup"])
    best = ranked[0]
    speculative = [e for e in ranked if e["spec"] != "none"]
    reasons = []
    if best["spec"] == "none":
        text = "--spec none (the target alone)"
        if not speculative:
            reasons.append("only the target alone was run")
        else:
            runner_up = speculative[0]
            reasons.append(f"no configuration beats it; the fastest, {runner_up['name']}, is "
                           f"{runner_up['speedup']:.2f}x")
    else:
        text = f"{best['flags']}: {best['speedup']:.2f}x over the target alone"
        if best["speedup"] < 1 + NOISE:
            reasons.append("within measurement noise of the target alone")
        more = max(speculative, key=lambda e: e["acceptance"] or 0.0)
        if more is not best and (more["acceptance"] or 0) > (best["acceptance"] or 0):
            reasons.append(f"{more['name']} accepts more ({100 * more['acceptance']:.0f}% vs "
                           f"{100 * best['acceptance']:.0f}%) but is {more['speedup']:.2f}x end-to-end")
    group_best = [{"workload": e["workload"], "temperature": e["temperature"], "name": e["name"],
                   "speedup": e["speedup"]} for e in _best_local_by_group(entries)]
    for g in group_best:
        if g["name"] != best["name"] and g["workload"] != ALL and len(reasons) < 4:
            reasons.append(f"on {g['workload']} at temperature {g['temperature']:g}, {g['name']} is fastest "
                           f"({g['speedup']:.2f}x)")
    reason = "; ".join(reasons)
    return {"name": best["name"], "flags": best["flags"],
            "spec": best["spec"], "draft_model": best["draft_model"], "draft_max": best["draft_max"],
            "speedup": best["speedup"], "acceptance": best["acceptance"], "reason": reason,
            "text": f"{text}; {reason}" if reason else text,
            "overall": sorted(overall.values(), key=lambda e: -e["speedup"]), "best_by_group": group_best}


def _best_local_by_group(entries: list[dict]) -> list[dict]:
    best: dict[tuple, dict] = {}
    for e in entries:
        key = (e["workload"], e["temperature"])
        if e["spec"] != "endpoint" and (key not in best or e["speedup"] > best[key]["speedup"]):
            best[key] = e
    return list(best.values())


def machine_info(n_threads: int | None) -> dict:
    """What the numbers were measured on."""
    from .. import __version__

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        import llama_cpp
        llama_version = llama_cpp.__version__
    except (ImportError, AttributeError):
        llama_version = None
    return {"platform": platform.platform(), "cpu": cpu, "cpu_count": os.cpu_count(), "n_threads": n_threads,
            "python": sys.version.split()[0], "llama_cpp_python": llama_version, "specserve": __version__,
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
