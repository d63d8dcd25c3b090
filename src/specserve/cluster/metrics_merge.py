"""One /metrics for all replicas: their Prometheus texts summed sample by sample.

Every replica renders the single server's metrics; the ingress serves their sum under the
same names and labels, so a dashboard or `specserve bench --endpoint` reads a replicated
endpoint as it reads one server. Counters and histograms add up; gauges (requests
processing, queue depth) become totals over the replicas; `*_created` timestamps take the
earliest. A replica that restarts starts its counters from zero, so a sum can drop: to
Prometheus' rate() that is a counter reset. Only replicas that reported recently are summed
(see `registry.Registry`).
"""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def _fmt_labels(labels: dict) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items())) + "}"


def _escape(v: str) -> str:
    """A label value as the exposition format writes it."""
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _fmt_value(v: float) -> str:
    return repr(float(v)) if v != int(v) or abs(v) >= 1e15 else f"{int(v)}.0"


def merge(texts: list[str], extra: list[tuple[str, str, float]] = ()) -> str:
    """The sum of Prometheus text expositions, as one exposition. extra: (name, help, value) gauges."""
    families: dict[str, dict] = {}  # name -> {"type", "help", "samples": {(sample name, labels): value}}
    for text in texts:
        for fam in text_string_to_metric_families(text):
            f = families.setdefault(fam.name, {"type": fam.type, "help": fam.documentation, "samples": {}})
            for s in fam.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                old = f["samples"].get(key)
                if s.name.endswith("_created"):
                    f["samples"][key] = s.value if old is None else min(old, s.value)
                else:
                    f["samples"][key] = s.value + (old or 0.0)
    out = []
    for name, f in families.items():
        out.append(f"# HELP {name} {f['help']}")
        out.append(f"# TYPE {name} {f['type']}")
        out += [f"{sname}{_fmt_labels(dict(labels))} {_fmt_value(v)}" for (sname, labels), v in f["samples"].items()]
    for name, help_, value in extra:
        out += [f"# HELP {name} {help_}", f"# TYPE {name} gauge", f"{name} {_fmt_value(value)}"]
    return "\n".join(out) + "\n"
