"""Memory: what the loaded models and their caches take."""
from __future__ import annotations


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def loaded_summary(engine) -> str:
    """One line per model with what llama.cpp reported allocating (weights, KV cache, compute)."""
    lines = []
    for role, model in (("target", engine.target), ("draft", engine.draft)):
        if model is None:
            continue
        lines.append(f"memory: {role} {model.path}: weights {fmt_bytes(model.weights_bytes)}")
    return "\n".join(lines)
