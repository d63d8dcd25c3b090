"""The host work of a speculative step (issue 64): everything but llama_decode, on replayed passes.

A generation runs once for real under --spec auto with the draft model pinned at k tokens a step
(`Pinned`; or under --spec draft: no controller, no stopping rule), recording each forward pass's
tokens and logits. It is then replayed: the same generator of passes (Slot.generate_steps), each
pass answered from the record, llama_decode skipped but the rest of the context's eval kept (its
batch built, its logits view taken), the logits handed over as llama.cpp does (a view of one
buffer per context, just written). So every CPU second the replay spends is host work, and it can
be repeated until the minimum holds on a busy machine. Time is the replaying thread's CPU time
(time.thread_time), split by part, each part's own time (a part inside another is not counted
twice); the total comes from replays without the parts' clock, which costs a system call a read:

  draft draws      the drafter's Python: its cache sync, drawing k tokens from the draft's logits
                   (greedy argmax, or temperature/top-k/top-p/min-p and the keyed draw), the top
                   probability the stopping rule reads
  draft batch      the draft context's eval without llama_decode (batch, logits view), k passes
  target batch     the same for the target's pass of k + 1 tokens
  verify           the verifier over the k + 1 rows (greedy compare, gumbel or rejection)
  commit           cutting the verdict at EOG/max_tokens/stop strings, detokenizing
  logprobs         the committed tokens' logprobs, when asked
  controller       auto's choose/observe/offers and its stopping rule
  lookups          the lookup drafters auto asks each step (their offers and shadow proposals)
  other            the rest of the engine's step (stats, policy glue)

Steps whose draft fell short of k (an end-of-generation token, max_tokens) are left out; so is the
first, which carries the prompt.
"""
from __future__ import annotations

import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace

import numpy as np

from specserve import slot as slot_module
from specserve.config import SamplingParams, SpecParams
from specserve.policy import Choice, FixedPolicy
from specserve.steps import Eval

PARTS = ("draft draws", "draft batch", "target batch", "verify", "commit", "logprobs", "controller", "lookups",
         "other")


class Clock:
    """Exclusive CPU time per part: entering a part pauses the one it was entered from. Off, it wraps nothing.

    A read of the thread's CPU time is a system call (about 2 us in a VM): each interval a part is charged
    then holds about one read's cost, which `parts` takes off again (`cost`, measured at the start)."""

    def __init__(self, on: bool = True):
        self.on = on
        self.t: dict[str, float] = defaultdict(float)
        self.n: dict[str, int] = defaultdict(int)  # intervals charged to each part
        self.stack: list[str] = []
        self.cost = min(_read_cost() for _ in range(5))
        self.mark = time.thread_time()

    def enter(self, key: str) -> None:
        if not self.on:
            return
        now = time.thread_time()
        if self.stack:
            self._charge(self.stack[-1], now)
        self.stack.append(key)
        self.mark = now

    def leave(self) -> None:
        if not self.on:
            return
        now = time.thread_time()
        self._charge(self.stack.pop(), now)
        self.mark = now

    def _charge(self, key: str, now: float) -> None:
        self.t[key] += now - self.mark
        self.n[key] += 1

    def parts(self) -> dict[str, float]:
        """Seconds per part so far, less the reads' cost."""
        return {k: v - self.n[k] * self.cost for k, v in self.t.items()}

    def calls(self, fn, key: str):
        if not self.on:
            return fn

        def timed(*a, **kw):
            self.enter(key)
            try:
                return fn(*a, **kw)
            finally:
                self.leave()
        return timed

    def steps(self, fn, key: str):
        """A generator function's Python, timed between its yields (its passes run outside it)."""
        if not self.on:
            return fn

        def timed(*a, **kw):
            gen, out = fn(*a, **kw), None
            while True:
                self.enter(key)
                try:
                    op = gen.send(out)
                except StopIteration as e:
                    return e.value
                finally:
                    self.leave()
                out = yield op
        return timed


def _read_cost(n: int = 2000) -> float:
    """Seconds one time.thread_time() takes."""
    t0 = time.perf_counter()
    for _ in range(n):
        time.thread_time()
    return (time.perf_counter() - t0) / n


class Pinned:
    """A real policy (auto's) asked and told everything, its choice replaced by the draft model at k tokens
    with a stopping rule that is asked (auto's own, or a stand-in that costs the drafter its top
    probability) but never stops: every step drafts k tokens whatever the policy learnt, so a replay
    makes the same passes as the run it replays."""

    def __init__(self, inner, k: int, clock: Clock, stop: bool = True):
        self.inner, self.k, self.clock, self.stop = inner, k, clock, stop
        self.predicted_tokens_per_s = 0.0
        self.sees_offers = getattr(inner, "sees_offers", False)
        self.drafted: list[int] = []  # each step's draft length

    def see(self, drafter, offer):
        self.clock.calls(self.inner.see, "controller")(drafter, offer)

    def choose(self) -> Choice:
        stop = self.clock.calls(self.inner.choose, "controller")().stop
        if not self.stop:  # --spec draft: no stopping rule, no top probability
            return Choice("draft", self.k)
        rule = self.clock.calls(stop, "controller") if stop is not None else None

        def never(i: int, p: float) -> bool:
            if rule is not None:
                rule(i, p)
            return False

        return Choice("draft", self.k, never)

    def observe(self, outcome) -> None:
        self.drafted.append(outcome.n_drafted)
        self.clock.calls(self.inner.observe, "controller")(outcome)

    def prefill(self, drafter, n_missing, max_tokens) -> bool:
        self.inner.prefill(drafter, n_missing, max_tokens)
        return drafter == "draft"

    def prefilled(self, drafter, n_tokens, seconds) -> None:
        self.inner.prefilled(drafter, n_tokens, seconds)

    def finish(self) -> None:
        self.inner.finish()


@dataclass
class Record:
    passes: list[tuple[str, tuple[int, ...], np.ndarray]] = field(default_factory=list)  # (model, tokens, logits)
    tokens: list[int] = field(default_factory=list)


def _instrument(engine, clock: Clock, k: int, pinned: list, mode: str) -> list:
    """Wrap the engine's parts with the clock; returns what to restore."""
    import specserve.drafters.draft_model as dm
    import specserve.drafters.ngram as ng
    import specserve.drafters.suffix as sx
    import specserve.commit as cm

    undo = [(engine, "policy_for", None)]
    real_policy_for = engine.policy_for

    def policy_for(spec, temperature=0.0, grammar=False, prompt=None):
        if mode == "draft":  # --spec draft: a fixed length, no controller
            p = Pinned(FixedPolicy("draft", k), k, clock, stop=False)
        else:
            p = Pinned(real_policy_for(SpecParams(mode="auto"), temperature, grammar, prompt), k, clock)
        pinned.append(p)
        return p

    engine.policy_for = policy_for
    wraps = [(dm.DraftModelDrafter, "propose_steps", clock.steps, "draft draws"),
             (slot_module, "verify", clock.calls, "verify"),
             (slot_module, "commit", clock.calls, "commit"),
             (cm.Request, "take_logprobs", clock.calls, "logprobs"),
             (slot_module, "ask_offers", clock.calls, "lookups"),
             (ng.NgramDrafter, "propose", clock.calls, "lookups"),
             (sx.SuffixDrafter, "propose", clock.calls, "lookups")]
    for owner, name, how, key in wraps:
        fn = owner.__dict__[name]
        undo.append((owner, name, fn))
        setattr(owner, name, how(fn, key))
    return undo


def _restore(undo: list) -> None:
    for owner, name, fn in reversed(undo):
        if fn is None:
            delattr(owner, name)
        else:
            setattr(owner, name, fn)


def run(slot, prompt: list[int], params: SamplingParams, method: str, k: int, record: Record,
        clock: Clock | None = None, mode: str = "auto") -> list[dict[str, float]]:
    """One generation: for real, filling an empty `record`; or replayed from it, timed by `clock` (parts) and
    per step. Returns each step's seconds (per part and "total") for the steps that drafted k tokens."""
    clock, pinned = clock or Clock(on=False), []
    undo = _instrument(slot.engine, clock, k, pinned, mode)
    replay = bool(record.passes)
    draft_cells = getattr(slot.draft_ctx, "inner", slot.draft_ctx)
    contexts = {id(slot.ctx): "target", id(draft_cells): "draft"}
    decoders, buffers = {}, {}
    if replay:
        for c in (slot.ctx, draft_cells):
            decoders[c] = c.__dict__.get("_decode")
            c._decode = lambda b: 0  # the batch is built, nothing is computed
    slot.forget_cache()
    gen = slot.generate_steps(prompt, params, SpecParams(mode="auto"), method)
    steps, tokens, i, out = [], [], 0, None
    t_step, parts0, excluded = time.thread_time(), {}, 0.0
    try:
        while True:
            try:
                item = gen.send(out)
            except StopIteration:
                break
            if type(item) is Eval:
                who = contexts[id(item.ctx)]
                clock.enter(who + " batch")
                try:
                    out = item.run()
                finally:
                    clock.leave()
                if not replay:
                    record.passes.append((who, tuple(item.tokens), np.array(out)))  # a copy: the view is reused
                    continue
                model, toks, logits = record.passes[i]
                if (model, toks) != (who, tuple(item.tokens)):
                    raise RuntimeError(f"replay diverged at pass {i}: {who} {list(item.tokens)[:4]}... "
                                       f"recorded {model} {list(toks)[:4]}...")
                # as llama.cpp hands them: a view of one buffer per context, just written (so in cache); the
                # copy that writes it is not host work of the engine's
                t0 = time.thread_time()
                buf = buffers.get(who)
                if buf is None or len(buf) < len(logits):
                    buf = buffers[who] = np.empty_like(logits)
                out = buf[: len(logits)]
                np.copyto(out, logits)
                excluded += time.thread_time() - t0 + clock.cost
                i += 1
                continue
            out = None
            tokens.extend(item.tokens)  # a Chunk: one step done
            now, parts = time.thread_time(), clock.parts()
            step = {p: parts.get(p, 0.0) - parts0.get(p, 0.0) for p in PARTS}
            step["total"] = now - t_step - excluded
            step["other"] = step["total"] - sum(v for p, v in step.items() if p not in ("total", "other"))
            steps.append((pinned[0].drafted[-1] if pinned[0].drafted else 0, step))
            t_step, parts0, excluded = time.thread_time(), clock.parts(), 0.0  # (the reads fall outside any step)
    finally:
        gen.close()
        _restore(undo)
        for c, fn in decoders.items():
            if fn is None:
                del c._decode
            else:
                c._decode = fn
    if not replay:
        record.tokens = tokens
    elif tokens != record.tokens:
        raise RuntimeError("the replay generated other tokens than the run it replays")
    return [s for n, s in steps[1:] if n == k]


def measure(slot, prompt: list[int], params: SamplingParams, method: str, k: int, repeats: int,
            logprobs_variants: tuple[int | None, ...] = (None,), mode: str = "auto") -> dict:
    """Record one generation, then replay it `repeats` times per logprobs variant with the parts timed and as
    many times without (the total: the parts' timing costs reads of the clock). In ms, the mean per step of
    each replay: min and median over the replays."""
    record = Record()
    run(slot, prompt, params, method, k, record, mode=mode)
    out = {}
    for n_top in logprobs_variants:
        p = params if n_top is None else replace(params, logprobs=n_top)
        per_replay, n_steps = defaultdict(list), 0
        for _ in range(repeats):
            for timed in (True, False):
                steps = run(slot, prompt, p, method, k, record, Clock(on=timed), mode)
                n_steps = len(steps)
                for part in PARTS if timed else ("total",):
                    per_replay[part].append(1000 * statistics.fmean(s[part] for s in steps))
        ms = {part: {"min": min(v), "median": statistics.median(v)} for part, v in per_replay.items()}
        ms["other"] = {m: ms["total"][m] - sum(ms[q][m] for q in PARTS if q != "other") for m in ("min", "median")}
        out["logprobs %d" % n_top if n_top is not None else "no logprobs"] = {
            "steps": n_steps, "passes": len(record.passes), "ms": ms}
    return out
