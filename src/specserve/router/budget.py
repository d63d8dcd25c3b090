"""--models-memory: what a model's child will take, estimated before it starts, as `specserve check` does.

A child holds its target (and draft) weights once, a KV cache and compute buffers per slot (-np) for
each model (memory.py's estimate, from the GGUF headers alone), its cross-request store, and the
Python process itself. The pool keeps the sum over the children it runs within the budget: a load
first unloads the least recently used idle models, and a model that would not fit alone is refused
with the numbers.
"""
from __future__ import annotations

import argparse

from ..config import DRAFT_CTX_DEFAULT, UBATCH_DRAFT_DEFAULT, default_ubatch
from ..memory import ModelShape, cells, estimate, fmt_bytes

PROCESS_BYTES = 100 << 20  # a `specserve serve` process before its models: 87 MiB resident measured, rounded up


def child_memory(args: list[str], parser: argparse.ArgumentParser) -> tuple[int, str]:
    """(bytes, how they add up) for a child started with `args` (after `serve`); ValueError where the
    models' headers cannot be read."""
    from .. import models

    try:
        ns = parser.parse_args(args)
    except SystemExit:
        raise ValueError(f"cannot read the child's flags: {' '.join(args)}") from None
    slots = max(1, ns.parallel)
    parts, total = [], PROCESS_BYTES
    roles = [("target", ns.model, ns.ctx_size, ns.ubatch_size or default_ubatch(ns.n_gpu_layers))]
    if ns.model_draft and ns.model_draft not in ("auto", "none"):
        window = cells(ns.ctx_size, getattr(ns, "draft_ctx", DRAFT_CTX_DEFAULT))
        roles.append(("draft", str(models.resolve(ns.model_draft)), window,
                      getattr(ns, "ubatch_size_draft", UBATCH_DRAFT_DEFAULT)))
    for role, path, n_ctx, n_ubatch in roles:
        est = estimate(ModelShape.from_gguf(path), n_ctx, n_ubatch=n_ubatch)
        total += est.weights + slots * (est.kv + est.compute)
        parts.append(f"{role} weights {fmt_bytes(est.weights)} + {slots} slot(s) x (KV {fmt_bytes(est.kv)} + "
                     f"compute {fmt_bytes(est.compute)})")
    if ns.model_draft == "auto":  # the child chooses as it starts: not known here
        parts.append("the draft -md auto chooses, not counted")
    if not ns.no_cross_request:
        total += int(ns.cross_request_mib * (1 << 20))
        parts.append(f"cross-request store {fmt_bytes(ns.cross_request_mib * (1 << 20))}")
    parts.append(f"process {fmt_bytes(PROCESS_BYTES)}")
    return total, f"{fmt_bytes(total)}: " + ", ".join(parts)
