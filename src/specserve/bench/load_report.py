"""`specserve bench --clients`: the load runs' rows and tables (the runs themselves: clients.py).

A row is one configuration at one client count: its aggregate tok/s (the median over its runs at that count;
a configuration runs once per count, a baseline once beside each configuration it is paired with), the
aggregate of its baseline's run beside it and their ratio, and its requests' p50 and p95 (nearest rank) of
the decode rate after the first token, the time to first token and the time queued for a slot.
"""
from __future__ import annotations

import math
import statistics


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank q-quantile (None for no values): p95 of 12 requests is the 12th, not an interpolation."""
    v = sorted(values)
    return v[max(0, math.ceil(q * len(v)) - 1)] if v else None


def request_summary(requests: list[dict]) -> dict:
    """p50/p95 of the per-request decode rate, time to first token and queue time (None where unreported)."""
    def pcts(key: str, label: str, scale: int = 4) -> dict:
        values = [r[key] for r in requests if r.get(key) is not None]
        return {f"{label}_p{int(100 * q)}": None if (x := percentile(values, q)) is None else round(x, scale)
                for q in (0.5, 0.95)}

    return {**pcts("decode_tokens_per_s", "decode", 2), **pcts("ttft_s", "ttft"), **pcts("queue_s", "queue")}


def summarize_load(runs: list[dict], pairs: list[tuple[str, str]], levels: list[int]) -> list[dict]:
    """One row per (clients, configuration): its aggregate (the median over its runs at that count, one for a
    configuration), its baseline's aggregate from the runs beside it, their ratio, and its requests' p50/p95."""
    rows = []
    names = list(dict.fromkeys(who for config, base in pairs for who in (base, config)))
    base_of = dict(pairs)
    for n in levels:
        at_n = [r for r in runs if r["clients"] == n]
        for name in names:
            own = [r for r in at_n if r["config"] == name]
            if not own:
                continue
            base = base_of.get(name, name)
            beside = [r for r in at_n if r["config"] == base and r["pair"] == name] if base != name else []
            agg = statistics.median(r["aggregate_tokens_per_s"] for r in own)
            base_agg = statistics.median(r["aggregate_tokens_per_s"] for r in beside) if beside else None
            requests = [q for r in own for q in r["requests"]]
            rows.append({"clients": n, "config": name, "baseline": base if base != name else None,
                         "n_runs": len(own), "n_requests": len(requests),
                         "n_generated": sum(r["n_generated"] for r in own),
                         "aggregate_tokens_per_s": round(agg, 2),
                         "baseline_tokens_per_s": None if base_agg is None else round(base_agg, 2),
                         "ratio": round(agg / base_agg, 4) if base_agg else None,
                         **request_summary(requests),
                         "acceptance": _acceptance(requests)})
    return rows


def _acceptance(requests: list[dict]) -> float | None:
    drafted = sum(r["n_drafted"] for r in requests)
    return round(sum(r["n_accepted"] for r in requests) / drafted, 4) if drafted else None


def render_load(rows: list[dict], per_client: int, workloads: list[str]) -> str:
    """A table per client count, then aggregate tok/s by configuration and count with each ratio beside."""
    def f(x, spec: str, unit: str = "") -> str:
        return "-" if x is None else f"{x:{spec}}{unit}"

    width = max(len("configuration"), *(len(r["config"]) for r in rows)) if rows else 13
    lines = [f"mixed work: {', '.join(workloads)}; aggregate: completion tokens over the wall time from the first "
             "send to the last answer;",
             "no-spec: the configuration's own baseline (speculation off, or its --endpoint-baseline), run beside "
             "it; ratio: aggregate / no-spec;",
             "per request: decode tok/s after the first token, time to first token and time queued for a slot "
             "(s), p50 and p95", ""]
    for n in dict.fromkeys(r["clients"] for r in rows):
        lines += [f"{n} client{'s' if n > 1 else ''} at once, {per_client} requests each",
                  f"{'configuration':<{width}} {'aggregate':>9} {'no-spec':>8} {'ratio':>6} {'decode p50':>10} "
                  f"{'p95':>8} {'ttft p50':>8} {'p95':>6} {'queue p50':>9} {'p95':>6} {'accept':>6}"]
        for r in (r for r in rows if r["clients"] == n):
            lines.append(f"{r['config']:<{width}} {r['aggregate_tokens_per_s']:>9.1f} "
                         f"{f(r['baseline_tokens_per_s'], '.1f'):>8} {f(r['ratio'], '.2f', 'x'):>6} "
                         f"{f(r['decode_p50'], '.1f'):>10} {f(r['decode_p95'], '.1f'):>8} "
                         f"{f(r['ttft_p50'], '.2f'):>8} {f(r['ttft_p95'], '.2f'):>6} "
                         f"{f(r['queue_p50'], '.2f'):>9} {f(r['queue_p95'], '.2f'):>6} "
                         f"{f(None if r['acceptance'] is None else 100 * r['acceptance'], '.0f', '%'):>6}")
        lines.append("")
    levels = list(dict.fromkeys(r["clients"] for r in rows))
    cell = {(r["config"], r["clients"]): r for r in rows}
    lines.append("aggregate tok/s by clients (its ratio to its own no-speculation rate beside it)")
    lines.append(f"{'configuration':<{width}} " + " ".join(f"{f'{n} client' + ('s' if n > 1 else ''):>16}"
                                                           for n in levels))
    for name in dict.fromkeys(r["config"] for r in rows):
        cells = []
        for n in levels:
            r = cell.get((name, n))
            text = "-" if r is None else f"{r['aggregate_tokens_per_s']:.1f}" + (
                f" ({r['ratio']:.2f}x)" if r["ratio"] is not None else "")
            cells.append(f"{text:>16}")
        lines.append(f"{name:<{width}} " + " ".join(cells))
    return "\n".join(lines)
