"""The benchmark's text report: ranked tables, speedup by workload, memory, recommendation."""
from __future__ import annotations

from ..memory import fmt_bytes
from .report import ALL

def _header(width: int) -> str:
    return (f"{'rank':>4}  {'configuration':<{width}} {'tok/s':>7} {'speedup':>8} {'e2e':>6} {'accept':>7} "
            f"{'tau':>5} {'ttft s':>7} {'decode':>7} {'memory':>10}")


def _row(e: dict, width: int) -> str:
    drafted = e["n_drafted"] > 0  # the target alone and endpoints draft nothing we can see
    # an endpoint may report what it drafted and accepted but not its passes: no tau
    accept = f"{100 * e['acceptance']:.1f}%" if drafted and e["acceptance"] is not None else "-"
    tau = f"{e['mean_accepted_len']:.2f}" if drafted and e["mean_accepted_len"] is not None else "-"
    memory = fmt_bytes(e["memory_bytes"]) if e["memory_bytes"] else "-"
    e2e = f"{e['speedup_e2e']:.2f}x" if e.get("speedup_e2e") else "-"
    return (f"{e['rank']:>4}  {e['name']:<{width}} {e['tokens_per_s']:>7.1f} {e['speedup']:>7.2f}x {e2e:>6} "
            f"{accept:>7} {tau:>5} {e['ttft_s']:>7.3f} {e.get('decode_tokens_per_s', 0.0):>7.1f} {memory:>10}")


def _name_width(entries: list[dict]) -> int:
    return max(len("configuration"), *(len(e["name"]) for e in entries))


def ranked_tables(entries: list[dict]) -> list[str]:
    """One table per temperature over all workloads, best first."""
    lines, width = [], _name_width(entries)
    for t in dict.fromkeys(e["temperature"] for e in entries):
        group = sorted((e for e in entries if e["temperature"] == t and e["workload"] == ALL), key=lambda e: e["rank"])
        n_prompts = max(e["n_prompts"] for e in group)
        lines += [f"temperature {t:g}, all workloads ({n_prompts} prompts), ranked by speed after the prompt "
                  f"(speedup: geometric mean of per-prompt ratios to the target alone; e2e: the same to the last "
                  f"token, the prompt included, timed alike for every configuration)", _header(width)]
        lines += [_row(e, width) for e in group] + [""]
    return lines


def workload_matrix(entries: list[dict]) -> list[str]:
    """Speedup of each configuration on each workload, one block per temperature (skipped for one workload); "-"
    where a workload has no prompt at that temperature."""
    workloads = [w for w in dict.fromkeys(e["workload"] for e in entries) if w != ALL]
    if len(workloads) < 2:
        return []
    width, name_width = max(9, *(len(w) for w in workloads)), _name_width(entries)
    lines = []
    for t in dict.fromkeys(e["temperature"] for e in entries):
        cell = {(e["name"], e["workload"]): e["speedup"] for e in entries if e["temperature"] == t}
        names = [e["name"] for e in sorted((e for e in entries if e["temperature"] == t and e["workload"] == ALL),
                                           key=lambda e: e["rank"])]
        lines.append(f"speedup by workload, temperature {t:g}")
        lines.append(f"{'configuration':<{name_width}} " + " ".join(f"{w:>{width}}" for w in [*workloads, ALL]))
        for name in names:
            lines.append(f"{name:<{name_width}} " + " ".join(
                f"{cell[name, w]:>{width - 1}.2f}x" if (name, w) in cell else f"{'-':>{width}}"
                for w in [*workloads, ALL]))
        lines.append("")
    return lines


def memory_lines(memory: dict) -> list[str]:
    """What llama.cpp reported allocating for each model and its slot's caches."""
    if "target" not in memory:
        return []
    models = [("target", memory["target"])] + [(f"draft {name}", m) for name, m in memory["drafts"].items()]
    lines = ["memory (as llama.cpp reported it, one slot each):"]
    for role, m in models:
        lines.append(f"  {role}: weights {fmt_bytes(m['weights_bytes'])}, KV cache {fmt_bytes(m['kv_bytes'])}, "
                     f"compute {fmt_bytes(m['compute_bytes'])}, total {fmt_bytes(m['total_bytes'])}")
    if memory.get("peak_rss_bytes"):
        lines.append(f"  peak resident memory of this process: {fmt_bytes(memory['peak_rss_bytes'])}")
    return lines + [""]


def turn_table(turns: list[dict]) -> list[str]:
    """Speedup by turn of the multi-turn conversations and of repeated requests: first request against the later
    ones."""
    lines = []
    for t in dict.fromkeys(e["temperature"] for e in turns):
        at_t = [e for e in turns if e["temperature"] == t]
        kinds = list(dict.fromkeys(e["turn"] for e in at_t))
        names = list(dict.fromkeys(e["name"] for e in at_t))
        cell = {(e["name"], e["turn"]): e for e in at_t}
        width, name_width = max(10, *(len(k) + 1 for k in kinds)), _name_width(at_t)
        lines.append(f"multi-turn conversations and repeats, temperature {t:g}: speedup over the target alone by "
                     f"turn (retry: the same request at once; again: after the run's other requests; later: every "
                     f"turn after the first; tau: mean accepted length there)")
        lines.append(f"{'configuration':<{name_width}} " + " ".join(f"{k:>{width}}" for k in kinds) + f" {'tau':>6}")
        for name in names:
            later = cell.get((name, "later"))
            measured = later and later["n_drafted"] and later["mean_accepted_len"]
            tau = f"{later['mean_accepted_len']:.2f}" if measured else "-"
            lines.append(f"{name:<{name_width}} " + " ".join(
                f"{cell[(name, k)]['speedup']:>{width - 1}.2f}x" if (name, k) in cell else f"{'-':>{width}}"
                for k in kinds) + f" {tau:>6}")
        lines.append("")
    return lines


def path_table(paths: list[dict]) -> list[str]:
    """Each configuration through the server against itself in-process."""
    if not paths:
        return []
    width = _name_width(paths)
    lines = ["through the server / in-process, the same requests (geometric mean of per-prompt tok/s ratios; "
             "1.00 = the server path costs nothing)",
             f"{'configuration':<{width}} {'T':>4} {'prompts':>7} {'ratio':>6} {'lowest':>7} {'highest':>7}"]
    lines += [f"{p['name']:<{width}} {p['temperature']:>4g} {p['n_prompts']:>7} {p['ratio']:>6.3f} {p['min']:>7.3f} "
              f"{p['max']:>7.3f}" for p in paths]
    return lines + [""]


def structured_table(entries: list[dict]) -> list[str]:
    """Per configuration and workload with JSON Schemas: speed, acceptance, the share of outputs that
    validate, and the grammar's own time per token and share of decode time (specserve's runs, in-process
    or served)."""
    rows = [e for e in entries if e.get("valid") is not None and e["workload"] != ALL]
    if not rows:
        return []
    width = _name_width(rows)
    wl = max(len("workload"), *(len(e["workload"]) for e in rows))
    lines = ["structured output: outputs that parse and validate against their schema",
             f"{'configuration':<{width}} {'workload':<{wl}} {'T':>4} {'tok/s':>7} {'speedup':>8} {'accept':>7} "
             f"{'valid':>7} {'grammar ms/tok':>14} {'of decode':>9}"]
    for e in rows:
        accept = f"{100 * e['acceptance']:.1f}%" if e["n_drafted"] and e["acceptance"] is not None else "-"
        gms = f"{e['grammar_ms_per_token']:.3f}" if e.get("grammar_ms_per_token") is not None else "-"
        share = f"{100 * e['grammar_share']:.1f}%" if e.get("grammar_share") is not None else "-"
        lines.append(f"{e['name']:<{width}} {e['workload']:<{wl}} {e['temperature']:>4g} {e['tokens_per_s']:>7.1f} "
                     f"{e['speedup']:>7.2f}x {accept:>7} {100 * e['valid']:>6.1f}% {gms:>14} {share:>9}")
    return lines + [""]


def render(entries: list[dict], recommendation: dict, memory: dict, turns: list[dict] = (),
           paths: list[dict] = ()) -> str:
    lines = ranked_tables(entries) + workload_matrix(entries) + structured_table(entries) + turn_table(list(turns)) \
        + path_table(list(paths)) + memory_lines(memory)
    lines.append(f"recommendation: {recommendation['text']}")
    return "\n".join(lines)
