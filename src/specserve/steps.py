"""A decoding step as a generator of forward passes, so that many sequences can share each pass.

The engine's per-sequence logic (prompt, drafters, verification, commit) does not call
`ctx.eval` itself: it yields an `Eval` and is sent the result. Whoever drives the
generator decides how the pass is run: `direct` runs it at once on its own context (one
sequence: exactly the calls the code made before), the server's batch scheduler gathers
the Evals of every active slot and runs them as one llama.cpp batch per model.

An Eval whose `split` is set is prompt processing: the driver may evaluate only a prefix
of its tokens now (without logits) and send back how many it took; `fill` asks again for
the rest. That is how a long prompt is chunked between other slots' decoding steps.
`seconds` is what the driver charges the pass to this sequence: its measured time when it
ran alone, its marginal share of a batch otherwise (batchcost.py).
"""
from __future__ import annotations

import time
from typing import Any, Generator, Sequence

from .backends.base import Context, common_prefix, pass_group


class Eval:
    """Evaluate `tokens` at `ctx`'s next positions; logits "all", "last" or None."""

    __slots__ = ("ctx", "tokens", "logits", "split", "seconds")

    def __init__(self, ctx: Context, tokens: Sequence[int], logits: str | None, split: bool = False):
        self.ctx, self.tokens, self.logits, self.split = ctx, tokens, logits, split
        self.seconds = 0.0

    @property
    def group(self):
        """What the pass runs on: the shared context `ctx` is a sequence of (passes of several sequences
        can be batched there), or `ctx` itself."""
        return pass_group(self.ctx)

    def run(self):
        """Run it alone, now: [rows, n_vocab] logits (a view valid until the context's next pass)."""
        t = time.perf_counter()
        out = self.ctx.eval(self.tokens, self.logits or "last")
        self.seconds = time.perf_counter() - t
        return out


Steps = Generator[Any, Any, Any]  # yields Evals (and, from the engine's step, Chunks); returns a value


def direct(gen: Steps):
    """Drive a generator that yields only Evals, each run at once; return its value."""
    out = None
    while True:
        try:
            op = gen.send(out)
        except StopIteration as e:
            return e.value
        out = op.run()


def drive(gen: Steps):
    """Drive the engine's step generator alone: run each Eval at once, pass on everything else."""
    out = None
    try:
        while True:
            try:
                item = gen.send(out)
            except StopIteration:
                return
            if type(item) is Eval:
                out = item.run()
            else:
                out = None
                yield item
    finally:
        gen.close()


class Meter:
    """Time spent waiting at yields and what the passes there were charged."""

    __slots__ = ("waited", "charged")

    def __init__(self):
        self.waited = self.charged = 0.0

    def cost(self, wall: float) -> float:
        """Seconds of this sequence's own work in `wall` seconds: its Python plus its passes' charge."""
        return wall - self.waited + self.charged


def metered(gen: Steps, meter: Meter) -> Steps:
    """`yield from gen`, recording in `meter` how long each pass took to come back and its charge."""
    out = None
    while True:
        try:
            op = gen.send(out)
        except StopIteration as e:
            return e.value
        t = time.perf_counter()
        out = yield op
        meter.waited += time.perf_counter() - t
        meter.charged += op.seconds


def fill(ctx: Context, tokens: Sequence[int], logits: str | None = "last") -> Steps:
    """Evaluate `tokens`, in as many pieces as the driver likes; return the last piece's logits."""
    while True:
        out = yield Eval(ctx, tokens, logits, split=True)
        if type(out) is not int:
            return out
        tokens = tokens[out:]


def _keep(ctx: Context, tokens: Sequence[int], reuse: int) -> int:
    """Make ctx hold a prefix of `tokens` (also shifted runs of >= `reuse` cached tokens when reuse > 0:
    Context.reuse) and return its length."""
    if reuse > 0:
        return ctx.reuse(tokens, reuse)
    keep = common_prefix(ctx.tokens, tokens)
    ctx.truncate(keep)
    return keep


def sync_prefix(ctx: Context, tokens: Sequence[int], reuse: int = 0) -> Steps:
    """backends.sync_prefix as steps: make ctx hold exactly `tokens`; return how many were cached.
    reuse > 0: llama-server's --cache-reuse, the least run of moved cached tokens worth keeping."""
    keep = _keep(ctx, tokens, reuse)
    if len(tokens) > keep:
        yield from fill(ctx, tokens[keep:])
    return keep


def sync_and_eval(ctx: Context, tokens: Sequence[int], reuse: int = 0) -> Steps:
    """backends.sync_and_eval as steps: ctx holds exactly `tokens`; return the logits after the last."""
    if reuse > 0:
        keep = ctx.reuse(tokens[:-1], reuse)
    else:
        keep = min(common_prefix(ctx.tokens, tokens), len(tokens) - 1)
        ctx.truncate(keep)
    return (yield from fill(ctx, tokens[keep:]))[0]
