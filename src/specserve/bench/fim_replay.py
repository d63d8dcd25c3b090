"""Run the fim-replay workload (fim_workload.py) against /infill servers and summarise it.

Every configuration replays every file's requests in editing order against a server's /infill
(streamed, as llama.vim's body asks, greedy, `n_indent` the line's indentation, no time limit so
that every configuration does the same work): specserve's own (bench/served.py, each
configuration as the request's `speculative` object, its own cross-request scope) or any
llama-server given with --endpoint. A file's first request goes out with `cache_prompt: false`
(the file just opened: nothing cached, for every configuration alike); the rest use the cache as
an editor does. Files rotate the order of the configurations, so drift falls on all alike.

Per configuration: p50 and p95 time per request (all, and the keystroke requests alone), time
to the first chunk with text, tokens per second end to end, how often the first line of the
suggestion is the file's real rest of the line, tokens evaluated per request (what the cache
saved), and how often the text is the target alone's (greedy: it should be always).
"""
from __future__ import annotations

import statistics
import sys
from dataclasses import asdict, dataclass

import httpx

from ..config import SUFFIX_MAX_DEFAULT
from .endpoint import infill_url, stream_infill
from .fim_workload import FimCase


@dataclass
class FimRun:
    config: str
    case: str  # file:line+typed
    typed: int
    t_total_s: float
    t_first_s: float
    n_generated: int
    prompt_n: int  # tokens the server evaluated for the prompt (not from its cache)
    cache_n: int
    n_drafted: int
    n_accepted: int
    match: bool
    text: str


def request_body(case: FimCase, n_predict: int, config, cold: bool, scope: str) -> dict:
    body = {"input_prefix": case.prefix, "input_suffix": case.suffix, "input_extra": [], "prompt": case.prompt,
            "n_predict": n_predict, "n_indent": case.n_indent, "temperature": 0.0, "cache_prompt": not cold}
    if config.spec != "endpoint":
        k = config.draft_max if config.spec != "none" else 0
        body["speculative"] = {"mode": config.spec, "draft_max": k,
                               "suffix_max": k if config.spec == "suffix" else SUFFIX_MAX_DEFAULT,
                               "cross_request_scope": scope}
    return body


def run_replay(configs, files: list[list[FimCase]], urls: dict[str, str], n_predict: int,
               progress: bool = True, timeout: float = 600.0) -> list[FimRun]:
    """Every configuration over every file's requests; urls: configuration name -> server base URL."""
    runs: list[FimRun] = []
    total = len(configs) * sum(map(len, files))
    with httpx.Client(timeout=timeout) as client:
        for config in configs:  # warm-up: one cold request each, not recorded
            stream_infill(client, infill_url(urls[config.name]), request_body(files[0][0], 8, config, True, "warm"))
        for f, cases in enumerate(files):
            shift = f % len(configs)
            for c, config in enumerate(configs[shift:] + configs[:shift]):
                scope = f"fim{configs.index(config)}"
                for j, case in enumerate(cases):
                    out = stream_infill(client, infill_url(urls[config.name]),
                                        request_body(case, n_predict, config, j == 0, scope))
                    runs.append(FimRun(config.name, case.key, case.typed, out["t_total_s"], out["t_first_s"],
                                       out["n_generated"], out["prompt_n"], out["cache_n"], out["n_drafted"],
                                       out["n_accepted"], case.matches(out["text"]), out["text"]))
                    if progress:
                        print(f"\rfim-replay {len(runs)}/{total} {config.name[:40]:40s}", end="", file=sys.stderr)
    if progress:
        print(file=sys.stderr)
    return runs


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


def summarize_replay(configs, runs: list[FimRun]) -> list[dict]:
    """One row per configuration (see the module's docstring); `vs_target`: the median over requests
    of its baseline's time / this one's, paired by request (the target alone, or for an endpoint the
    --endpoint-baseline server, its own target alone)."""
    by = {c.name: [r for r in runs if r.config == c.name] for c in configs}
    rows = []
    for c in configs:
        rs = by[c.name]
        if not rs:
            continue
        base = {r.case: r for r in by.get(c.baseline, [])}
        t = [r.t_total_s for r in rs]
        keys = [r.t_total_s for r in rs if r.typed > 0]
        paired = [base[r.case].t_total_s / r.t_total_s for r in rs if r.case in base and r.t_total_s > 0]
        same = [r.text == base[r.case].text for r in rs if r.case in base]
        rows.append({
            "config": c.name, "flags": c.flags, "baseline": c.baseline, "requests": len(rs),
            "p50_ms": 1000 * statistics.median(t), "p95_ms": 1000 * _pct(t, 0.95),
            "p50_keystroke_ms": 1000 * statistics.median(keys) if keys else 0.0,
            "ttft_p50_ms": 1000 * statistics.median([r.t_first_s for r in rs if r.t_first_s > 0] or [0.0]),
            "tokens_per_s": sum(r.n_generated for r in rs) / max(sum(t), 1e-9),
            "match": sum(r.match for r in rs) / len(rs),
            "prompt_n_mean": statistics.fmean(r.prompt_n for r in rs),
            "prompt_n_keystroke_mean": statistics.fmean([r.prompt_n for r in rs if r.typed > 0] or [0]),
            "acceptance": sum(r.n_accepted for r in rs) / max(1, sum(r.n_drafted for r in rs)),
            "vs_target": statistics.median(paired) if paired else None,
            "same_as_target": sum(same) / len(same) if same else None,
        })
    return rows


def render_replay(rows: list[dict]) -> str:
    head = ("configuration", "req", "p50 ms", "p95 ms", "p50 keys", "TTFT p50", "tok/s", "line match",
            "prompt tok", "keys tok", "accept", "vs target", "= target")
    table = [head]
    for r in rows:
        table.append((r["config"], str(r["requests"]), f"{r['p50_ms']:.0f}", f"{r['p95_ms']:.0f}",
                      f"{r['p50_keystroke_ms']:.0f}", f"{r['ttft_p50_ms']:.0f}", f"{r['tokens_per_s']:.1f}",
                      f"{100 * r['match']:.0f}%", f"{r['prompt_n_mean']:.0f}", f"{r['prompt_n_keystroke_mean']:.1f}",
                      f"{100 * r['acceptance']:.0f}%",
                      "-" if r["vs_target"] is None else f"{r['vs_target']:.2f}x",
                      "-" if r["same_as_target"] is None else f"{100 * r['same_as_target']:.0f}%"))
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
             for row in table]
    lines.insert(1, "-" * len(lines[0]))
    notes = ("p50/p95: time per /infill request, sent to last event; p50 keys: the keystroke requests alone (a few "
             "characters typed since the last one); TTFT: to the first chunk with text; line match: the suggestion's "
             "first line is the file's real rest of the line; prompt tok / keys tok: prompt tokens the server "
             "evaluated per request, all / keystroke requests (the rest came from its cache); vs target: median "
             "over requests of the target alone's time / this one's (an endpoint: its --endpoint-baseline's); "
             "= target: text identical to that baseline's")
    return "\n".join(lines) + "\n\n" + notes


def runs_json(runs: list[FimRun]) -> list[dict]:
    return [asdict(r) for r in runs]
