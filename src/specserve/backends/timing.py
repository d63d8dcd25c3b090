"""How long a model's 1-token pass takes now: the engine's calibration of a saved auto profile."""
from __future__ import annotations

import time

import numpy as np

from .base import Model


def token_seconds(*models: Model, n: int = 3) -> list[float]:
    """Seconds a 1-token pass of each model takes now, with its argmax: the median of n after a
    warm-up, in a small context of its own (about n + 1 passes each; 0.2 s for a 0.5B model on 2
    cores). The models' passes alternate, so that a slow spell of the machine falls on all of them."""
    ctxs = [m.new_context(32) for m in models]
    try:
        tokens = [m.vocab.bos if m.vocab.bos is not None else 0 for m in models]
        times: list[list[float]] = [[] for _ in models]
        for _ in range(n + 1):
            for ctx, token, ts in zip(ctxs, tokens, times):
                t = time.perf_counter()
                int(np.argmax(ctx.eval([token], logits="last")))
                ts.append(time.perf_counter() - t)
        return [float(np.median(ts[1:])) for ts in times]
    finally:
        for ctx in ctxs:
            ctx.close()
