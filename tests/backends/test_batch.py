"""Batched steps: many slots' passes in one llama.cpp batch give each slot what it gets alone.

The slots here are driven by the server's batch scheduler core (`Stepper`) without HTTP;
the server test (test_server_batch.py) checks the same through a real server.
"""
from __future__ import annotations

import numpy as np
import pytest

from specserve.batchcost import BatchCost
from specserve.config import SamplingParams, SpecParams
from specserve.drafters import BaseDrafter, Draft
from specserve.engine import Engine, standard_drafters
from specserve.slot import ContextOverflow
from specserve.server.core.batcher import Stepper

N_CTX = 256
PROMPTS = ["the cat sat on the mat", "Once upon a time", "the dog ran in the park and", "1 2 3 4 5 1 2 3"]
GREEDY = SamplingParams(max_tokens=40, ignore_eos=True)
SPECS = [SpecParams(mode="draft", draft_max=4), SpecParams(mode="ngram", draft_max=3), SpecParams(mode="none"),
         SpecParams(mode="auto", draft_max=6)]


class Batch:
    """Generations on shared slots, stepped by the batch scheduler's core."""

    def __init__(self, slots, n_batch: int = 512):
        self.passes: list[tuple[int, int]] = []  # (sequences, tokens) of each target pass
        self.stepper = Stepper({slots[0].ctx.shared}, n_batch, on_pass=lambda s, t: self.passes.append((s, t)))
        self.tokens: list[list[int]] = []
        self.ends: list[object] = []  # None: finished; else the exception
        self.log: list[tuple[int, int]] = []  # (run index, tokens) in emission order
        self.runs = []

    def add(self, slot, prompt, params=GREEDY, spec=SpecParams(mode="none")) -> int:
        i = len(self.tokens)
        self.tokens.append([])
        self.ends.append("running")

        def emit(item):
            if item is None or isinstance(item, Exception):
                self.ends[i] = item
            else:
                self.tokens[i].extend(item.tokens)
                self.log.append((i, len(item.tokens)))

        self.runs.append(self.stepper.add(slot.generate_steps(prompt, params, spec), emit))
        return i

    def run(self, until=lambda: False) -> None:
        while self.stepper.runs and not until():
            self.stepper.step()


def alone(tiny_models, prompt, params=GREEDY, spec=SpecParams(mode="none")) -> list[int]:
    return Engine(tiny_models["target"], tiny_models["draft_close"], n_ctx=N_CTX).new_slot().generate(
        prompt, params, spec).tokens


@pytest.fixture()
def slots(tiny_models):
    return Engine(tiny_models["target"], tiny_models["draft_close"], n_ctx=N_CTX).new_slots(4)


def test_one_batched_pass_gives_each_sequence_its_own_logits(tiny_models):
    model = tiny_models["target"]
    shared = model.new_shared_context(N_CTX, 3, 64)
    prompts = [model.tokenize(p) for p in PROMPTS[:3]]
    for seq, p in zip(shared.seqs, prompts):
        seq.eval(p[:-3], logits="last")
    outs = [o.copy() for o in shared.decode([(s, p[-3:], "all") for s, p in zip(shared.seqs, prompts)])]
    for p, out in zip(prompts, outs):
        ctx = model.new_context(N_CTX)
        ref = ctx.eval(p, logits="all")[-3:]
        np.testing.assert_allclose(out, ref, atol=1e-4)
        assert (out.argmax(-1) == ref.argmax(-1)).all()
        ctx.close()
    assert [len(s.tokens) for s in shared.seqs] == [len(p) for p in prompts]
    shared.seqs[0].truncate(2)  # one sequence's cache drops a suffix; the others keep theirs
    assert [len(s.tokens) for s in shared.seqs] == [2, len(prompts[1]), len(prompts[2])]


def test_batched_slots_generate_what_each_generates_alone(tiny_models, slots):
    b = Batch(slots)
    for slot, prompt, spec in zip(slots, PROMPTS, SPECS):
        b.add(slot, prompt, spec=spec)
    b.run()
    assert b.ends == [None] * 4
    for prompt, spec, tokens in zip(PROMPTS, SPECS, b.tokens):
        assert tokens == alone(tiny_models, prompt, spec=spec), (prompt, spec.mode)
    assert max(s for s, _ in b.passes) == 4  # every slot's verification in one target pass
    assert len(b.passes) < sum(len(t) for t in b.tokens)


def test_seeded_sampling_does_not_depend_on_the_batch(tiny_models, slots):
    sampled = SamplingParams(max_tokens=30, temperature=0.8, seed=11, ignore_eos=True)
    b = Batch(slots)
    b.add(slots[0], PROMPTS[0], sampled, SpecParams(mode="draft", draft_max=4))
    b.add(slots[1], PROMPTS[1], GREEDY, SpecParams(mode="ngram"))
    b.add(slots[2], PROMPTS[0], sampled, SpecParams(mode="none"))
    b.run()
    ref = alone(tiny_models, PROMPTS[0], sampled, SpecParams(mode="none"))
    assert b.tokens[0] == ref and b.tokens[2] == ref


class Failing(BaseDrafter):
    """An n-gram drafter that breaks at its third proposal."""

    name = "ngram"

    def __init__(self):
        self.calls = 0

    def propose(self, seq, k, sampler):
        self.calls += 1
        if self.calls == 3:
            raise RuntimeError("drafter broke")
        return Draft([seq[-1]] * k)


def test_cancel_finish_and_error_in_one_slot_leave_the_others_correct(tiny_models, slots):
    broken_slot = slots[3]
    broken_slot.engine.make_drafters = lambda slot, spec, constraint: (
        {"ngram": Failing()} if slot is broken_slot else standard_drafters(slot, spec, constraint))
    b = Batch(slots)
    long = b.add(slots[0], PROMPTS[0], spec=SpecParams(mode="draft", draft_max=4))
    short = b.add(slots[1], PROMPTS[1], SamplingParams(max_tokens=3, ignore_eos=True))
    cancelled = b.add(slots[2], PROMPTS[2], spec=SpecParams(mode="draft", draft_max=3))
    broken = b.add(slots[3], PROMPTS[3], spec=SpecParams(mode="ngram", draft_max=2))
    b.run(until=lambda: len(b.tokens[cancelled]) >= 5)
    b.stepper.cancel(b.runs[cancelled])
    b.run()
    assert b.ends[long] is None and b.ends[short] is None
    assert isinstance(b.ends[broken], RuntimeError) and b.ends[cancelled] == "running"
    assert b.tokens[long] == alone(tiny_models, PROMPTS[0], spec=SpecParams(mode="draft", draft_max=4))
    assert b.tokens[short] == alone(tiny_models, PROMPTS[1], SamplingParams(max_tokens=3, ignore_eos=True))
    assert b.tokens[cancelled] == alone(tiny_models, PROMPTS[2])[:len(b.tokens[cancelled])]
    # a slot whose request failed before its first pass ends with its error too
    b2 = Batch(slots)
    too_long = b2.add(slots[3], list(range(1, N_CTX + 5)))
    ok = b2.add(slots[0], PROMPTS[1])
    b2.run()
    assert isinstance(b2.ends[too_long], ContextOverflow) and b2.ends[ok] is None
    assert b2.tokens[ok] == alone(tiny_models, PROMPTS[1])


def test_a_long_prompt_is_chunked_between_the_other_slots_steps(tiny_models, slots):
    long_prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * 3)
    n_prompt = len(tiny_models["target"].tokenize(long_prompt))
    assert 64 < n_prompt < N_CTX - 20
    params, spec = SamplingParams(max_tokens=150, ignore_eos=True), SpecParams(mode="draft", draft_max=4)
    b = Batch(slots, n_batch=16)
    first = b.add(slots[0], PROMPTS[0], params, spec)
    b.run(until=lambda: len(b.tokens[first]) >= 3)
    late = b.add(slots[1], long_prompt, SamplingParams(max_tokens=10, ignore_eos=True))
    b.run()
    assert all(t <= 16 for _, t in b.passes)
    before = [i for i, _ in b.log[:b.log.index(next(e for e in b.log if e[0] == late))]]
    # the first slot kept decoding while the prompt went through in chunks of what was left of 16
    assert before.count(first) >= n_prompt // 16 - 1
    assert b.tokens[late] == alone(tiny_models, long_prompt, SamplingParams(max_tokens=10, ignore_eos=True))
    assert b.tokens[first] == alone(tiny_models, PROMPTS[0], params, spec)


def test_a_slot_keeps_its_cached_prefix_across_requests(tiny_models, slots):
    b = Batch(slots)
    b.add(slots[0], PROMPTS[0])
    b.run()
    reused = slots[0].ctx.tokens[:]
    assert len(reused) > len(tiny_models["target"].tokenize(PROMPTS[0]))
    from specserve.stats import GenerationStats

    stats = GenerationStats()
    b.stepper.add(slots[0].generate_steps(reused + [5], GREEDY, SpecParams(mode="none"), stats=stats),
                  lambda item: None)
    b.run()
    assert stats.n_cached == len(reused)


def test_batch_cost_charges_the_marginal_cost():
    cost = BatchCost()
    for _ in range(5):
        cost.add(1, 0.010)
        cost.add(4, 0.013)
        cost.add(8, 0.020)
    assert cost.charge(1, 1, 0.011) == 0.011  # alone: the whole pass
    assert cost.charge(8, 4, 0.020) == pytest.approx(0.007, abs=1e-3)  # cost(8) - cost(4)
    assert cost.charge(8, 1, 0.020) == pytest.approx(0.020 - 0.01825, abs=1e-4)  # cost(8) - cost(7), interpolated
    assert 0 <= cost.charge(4, 3, 0.013) <= 0.013


def test_batch_cost_extrapolates_and_inverts():
    cost = BatchCost()
    assert cost.cost(8) == 0.0 and cost.most_tokens(0.001, 1, 64) == 64  # nothing measured: no limit
    cost.add(1, 0.011)
    cost.add(9, 0.019)
    assert cost.cost(17) == pytest.approx(0.027)  # past the largest: the last segment's slope
    assert cost.most_tokens(0.022, 1, 512) == 12  # 0.010 + 0.001 n <= 0.022
    assert cost.most_tokens(0.001, 5, 512) == 5  # none fits: the least allowed
    assert cost.most_tokens(1.0, 1, 40) == 40


@pytest.mark.parametrize("slowdown,stall,most", [(2.0, 0.0, 1 + 11), (2.0, 0.0305, 20), (0.0, 0.0, None)])
def test_prompt_chunks_beside_streams_are_cut_to_the_slowdown(tiny_models, slots, monkeypatch, slowdown, stall, most):
    """With passes costing 10 ms + 1 ms a token, a stream's 1-token pass costs 11 ms: at slowdown 2
    a prompt chunk beside it may add 11 ms (11 tokens, at least MIN_CHUNK); with a stall of 30.5 ms, the
    larger bound, a pass holds 20 tokens; at slowdown 0 it fills the pass."""
    from specserve.server.core.batcher import MIN_CHUNK

    long_prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * 4)
    n_prompt = len(tiny_models["target"].tokenize(long_prompt))
    b = Batch(slots, n_batch=512)
    b.stepper.slowdown, b.stepper.stall = slowdown, stall
    group = slots[0].ctx.shared
    seeded = BatchCost()
    for n in (1, 2, 64, 512):
        seeded.add(n, 0.010 + 0.001 * n)
    monkeypatch.setattr(seeded, "add", lambda n, t: None)  # real timings must not move the seeded costs
    b.stepper.costs[id(group)] = seeded
    params = SamplingParams(max_tokens=60, ignore_eos=True)
    first = b.add(slots[0], PROMPTS[0], params)
    b.run(until=lambda: len(b.tokens[first]) >= 3)
    b.passes.clear()
    late = b.add(slots[1], long_prompt, SamplingParams(max_tokens=5, ignore_eos=True))
    b.run(until=lambda: len(b.tokens[late]) >= 1)
    mixed = [t for s, t in b.passes if s == 2]  # passes holding the stream and a chunk
    if slowdown:
        assert MIN_CHUNK < 11 and mixed and max(mixed) == most and len(mixed) >= n_prompt // most
    else:
        assert mixed[0] == n_prompt  # the prompt but its last token (its own pass) beside the stream, at once
    b.run()
    assert b.tokens[first] == alone(tiny_models, PROMPTS[0], params)
    assert b.tokens[late] == alone(tiny_models, long_prompt, SamplingParams(max_tokens=5, ignore_eos=True))


def test_serve_flag_default_is_the_schedulers():
    """`specserve serve` does not import the server to build its help: its default is a copy, kept equal."""
    from specserve.cli import build_parser
    from specserve.server.core.batcher import SLOWDOWN

    from specserve.server.core.batcher import STALL

    args = build_parser().parse_args(["serve"])
    assert args.prefill_slowdown == SLOWDOWN and args.prefill_stall == STALL


def test_calls_behind_reader_wakeups_run_at_the_next_step():
    """Readers wake the engine thread after every chunk they take; a call submitted behind those wake-ups
    (a new request's start, a cancel) must run between the next two steps, not once the backlog of
    wake-ups drains (one per step, while streams add three a step: a 2,000-token prompt waited a minute)."""
    import threading

    from specserve.server.core.batcher import Batcher

    class Busy:  # three streams that each wake the engine once a step
        ready, runs = True, []

        def __init__(self):
            self.steps = 0

        def step(self):
            self.steps += 1
            for _ in range(3):
                batcher._wake()

    busy = Busy()
    batcher = Batcher(busy)
    try:
        while busy.steps < 50:  # a backlog of wake-ups builds up
            threading.Event().wait(0.001)
        at = busy.steps
        assert batcher.submit(lambda: busy.steps).result(timeout=5) <= at + 2
    finally:
        batcher.shutdown()
