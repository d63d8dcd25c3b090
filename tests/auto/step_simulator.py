"""The engine's step simulated for `--spec auto`, with no model: costs from a table, acceptance from a seeded RNG.

A scenario gives the target's pass costs, each drafter's acceptance at each text position, how often the n-gram
finds a match, and the draft model's costs. `simulate` plays its requests one after the other (propose, verify,
observe) under a policy. Draws are tied to text positions (common random numbers), so every policy sees the same
text: whether the draft token at position p is accepted does not depend on which policy got there.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from specserve.auto import Controller
from specserve.config import SpecParams
from specserve.policy import FixedPolicy, Outcome


def curve(ms: dict[int, float]) -> Callable[[int], float]:
    """Seconds of a target pass over n tokens, linear between the measured points (ms)."""
    ns = sorted(ms)
    return lambda n: float(np.interp(n, ns, [ms[k] for k in ns])) / 1000 if n <= ns[-1] else \
        (ms[ns[-1]] + (ms[ns[-1]] - ms[ns[-2]]) / (ns[-1] - ns[-2]) * (n - ns[-1])) / 1000


# measured on the project's CPU (ANCHORS.md): SmolLM2-135M through llama-cpp-python
CPU_F16 = curve({1: 19, 2: 23, 4: 28, 8: 37, 16: 61})


CPU_Q41 = curve({1: 13, 2: 19, 4: 30, 8: 51, 16: 97})


GPU = curve({1: 20.0, 64: 26.3})  # memory-bound: ~flat in n


def const(a: float) -> Callable[[int], float]:
    return lambda p: a


@dataclass
class Scenario:
    verify: Callable[[int], float]  # seconds per target pass over n tokens
    accept: dict[str, Callable[[int], float]]  # drafter -> acceptance of a draft token at text position p
    match: Callable[[int], float] = const(0.0)  # P(the n-gram finds a match) at text position p
    draft_tok: float = 0.013  # seconds per token the draft model drafts
    catchup: float = 0.006  # seconds per extra token the draft model catches up on (one batch)
    n_requests: int = 8
    n_tokens: int = 500  # generated per request
    prompt: int = 64  # tokens the draft model must catch up on at its first use in a request
    cap: int = 8
    names: list[str] = field(default_factory=lambda: ["draft", "ngram"])


@dataclass
class Run:
    tokens_per_s: float
    steps: list[tuple[int, str | None, int]]  # (text position, drafter, k) per step
    predicted: float = 0.0


def request(s: Scenario, policy, seed: int, r: int, noise: np.random.Generator, steps: list):
    """One request's steps; yields the seconds each took (drafting + verifying)."""
    rng = np.random.default_rng([seed, r])
    u = {d: rng.random(s.n_tokens + s.cap + 1) for d in s.names}
    u_match = rng.random(s.n_tokens + 1)
    p, lag = 0, s.prompt
    if "draft" in s.names and policy.prefill("draft", s.prompt, s.n_tokens):  # the prompt in one batch
        policy.prefilled("draft", s.prompt, s.catchup * s.prompt)
        lag = 1
        yield s.catchup * s.prompt
    while p < s.n_tokens:
        c = policy.choose()
        k = min(c.k, s.n_tokens - p - 1)  # as the engine clips at max_tokens
        t_draft, n = 0.0, 0
        if k > 0 and c.drafter == "draft":
            n, t_draft = k, s.draft_tok * k + s.catchup * (lag - 1)
        elif k > 0 and c.drafter == "ngram":
            n, t_draft = (k if u_match[p] < s.match(p) else 0), 20e-6
        acc = 0
        while acc < n and u[c.drafter][p + acc] < s.accept[c.drafter](p + acc):
            acc += 1
        t_verify = s.verify(1 + n) * math.exp(0.05 * noise.standard_normal())
        policy.observe(Outcome(c, n, acc, t_draft, t_verify))
        # the draft model's cache lacks the bonus token (and its own last draft token)
        lag = (2 if acc == n else 1) if c.drafter == "draft" and k > 0 else lag + acc + 1
        steps.append((p, c.drafter if n else None, c.k))
        p += acc + 1
        yield t_draft + t_verify


def simulate(s: Scenario, make_policy, seed: int = 0) -> Run:
    """The scenario's requests one after the other."""
    noise, elapsed, steps, pred = np.random.default_rng([seed, 99]), 0.0, [], []
    for r in range(s.n_requests):
        policy = make_policy()
        elapsed += sum(request(s, policy, seed, r, noise, steps))
        policy.finish()  # as the engine does at a request's end
        pred.append(policy.predicted_tokens_per_s)
    return Run(s.n_requests * s.n_tokens / elapsed, steps, float(np.mean(pred)))


def compare(s: Scenario, seed: int = 0) -> tuple[Run, dict[tuple[str | None, int], float]]:
    """auto, and tokens/s of every fixed (drafter, k) including k = 0."""
    ctl = Controller()
    spec = SpecParams(draft_max=s.cap)
    auto = simulate(s, lambda: ctl.policy(spec, s.names), seed)
    fixed = {(None, 0): simulate(s, lambda: FixedPolicy(None, 0), seed).tokens_per_s}
    for d in s.names:
        for k in range(1, s.cap + 1):
            fixed[(d, k)] = simulate(s, lambda: FixedPolicy(d, k), seed).tokens_per_s
    return auto, fixed


def share(run: Run, pred) -> float:
    return sum(1 for st in run.steps if pred(st)) / len(run.steps)


SCENARIOS = {
    # F16 target, same-size draft at 30%, prose: the n-gram matches a third of the time, rarely right
    "cpu_f16_low": Scenario(CPU_F16, {"draft": const(0.3), "ngram": const(0.1)}, const(0.3)),
    # Q4_1 target: verifying costs nearly as much per token as decoding; a 13 ms/token draft
    # cannot pay even at 97% acceptance
    "cpu_q41_high": Scenario(CPU_Q41, {"draft": const(0.97), "ngram": const(0.2)}, const(0.3)),
    # llama-server's case (0.88x there): F16 target, draft accepted 97%
    "cpu_f16_high": Scenario(CPU_F16, {"draft": const(0.97), "ngram": const(0.2)}, const(0.3)),
    # GPU: verifying 9 tokens costs about as much as 1, cheap draft
    "gpu_high": Scenario(GPU, {"draft": const(0.9), "ngram": const(0.3)}, const(0.2),
                         draft_tok=0.001, catchup=0.0001),
    # GPU, draft acceptance switches from 0.02 to 0.95 halfway through each request
    "gpu_switch": Scenario(GPU, {"draft": lambda p: 0.02 if p < 250 else 0.95, "ngram": const(0.02)},
                           const(0.1), draft_tok=0.002, catchup=0.0001),
    # F16 target, expensive draft at 70%, text the n-gram predicts well when it matches
    "cpu_ngram": Scenario(CPU_F16, {"draft": const(0.7), "ngram": const(0.9)}, const(0.6)),
    # Q4_1 target, prose with a repeated passage (positions 200-350): only the n-gram can pay
    "cpu_q41_passage": Scenario(
        CPU_Q41, {"draft": const(0.6), "ngram": lambda p: 0.95 if 200 <= p < 350 else 0.1},
        lambda p: 0.95 if 200 <= p < 350 else 0.3),
}
