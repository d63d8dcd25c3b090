"""The benchmark's figure: speedup vs draft length per drafter, and acceptance by draft position."""
from __future__ import annotations

from .report import ALL


def _drafter(e: dict) -> str:
    """The configuration's name without its draft length: "draft[small]", "ngram"."""
    return e["name"].split(" k")[0]


def _hue_key(e: dict) -> str:
    return e["draft_model"] or e["spec"]


def write_plot(entries: list[dict], path: str) -> None:
    """Write a PNG: left, speedup over the target alone vs --draft-max for each drafter (auto as a
    marker at its cap); right, acceptance at each draft position for each drafter at its largest
    draft length. All workloads together, one line per temperature when there are several."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pooled = [e for e in entries if e["workload"] == ALL and e["spec"] != "endpoint"]
    temperatures = list(dict.fromkeys(e["temperature"] for e in pooled))
    suffix = (lambda t: f", T={t:g}") if len(temperatures) > 1 else (lambda t: "")
    # One colour per draft model (its auto run too) or drafter, one dash per temperature.
    hue = {key: f"C{i % 10}" for i, key in enumerate(dict.fromkeys(_hue_key(e) for e in pooled))}
    dashes = ["-", "--", ":", "-."]
    fig, (ax_speed, ax_accept) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, t in enumerate(temperatures):
        style = dict(linestyle=dashes[i % len(dashes)], marker="o")
        group = [e for e in pooled if e["temperature"] == t]
        for drafter in dict.fromkeys(_drafter(e) for e in group if e["spec"] in ("draft", "ngram")):
            line = sorted((e for e in group if _drafter(e) == drafter), key=lambda e: e["draft_max"])
            ax_speed.plot([e["draft_max"] for e in line], [e["speedup"] for e in line], color=hue[_hue_key(line[0])],
                          label=drafter + suffix(t), **style)
            top = line[-1]
            positions = range(1, len(top["acceptance_by_position"]) + 1)
            ax_accept.plot(positions, top["acceptance_by_position"], color=hue[_hue_key(line[0])],
                           label=f"{drafter} k={top['draft_max']}{suffix(t)}", **style)
        for e in group:
            if e["spec"] == "auto":
                ax_speed.scatter([e["draft_max"]], [e["speedup"]], marker="*", s=160, zorder=3,
                                 color=hue[_hue_key(e)], label=e["name"] + suffix(t))
    ax_speed.axhline(1.0, color="gray", linestyle="--", linewidth=1, label="target alone")
    ax_speed.set_xscale("log", base=2)
    ticks = sorted({e["draft_max"] for e in pooled if e["draft_max"]})
    ax_speed.set_xticks(ticks, [str(k) for k in ticks])
    ax_accept.xaxis.get_major_locator().set_params(integer=True)
    ax_speed.set_xlabel("--draft-max (tokens drafted per step)")
    ax_speed.set_ylabel("speedup over the target alone (geometric mean)")
    ax_speed.set_title("End-to-end speedup")
    ax_accept.set_xlabel("draft position")
    ax_accept.set_ylabel("acceptance rate")
    ax_accept.set_ylim(0, 1.05)
    ax_accept.set_title("Acceptance by position")
    for ax in (ax_speed, ax_accept):
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
