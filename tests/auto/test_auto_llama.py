"""`--spec auto` on the real llama.cpp backend (tiny models the suite writes): the
controller changes only how fast tokens come, never which.

Greedy: output equals the target alone, up to near-ties that llama.cpp's batched and
single-token kernels may break differently (the divergence must sit at a small top-2 gap).
Sampling: the joint distribution of the first two tokens over N seeded runs is within a
total-variation distance of the target's exact distribution that N alone explains.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from specserve.config import SamplingParams, SpecParams
from specserve.auto import AutoPolicy, Controller
from specserve.engine import Engine
from specserve.policy import Outcome
from specserve.sampling import process

pytest.importorskip("llama_cpp")

EPS = 1e-2  # top-2 logit gap below which batched and single-token passes may disagree (F16 KV cache)
N_RUNS = 1500
ALPHA = 1e-4  # chance that a lossless sampler fails the threshold below


def repeating(target, text: str, times: int = 3) -> list[int]:
    """A prompt the n-gram can draft from, so that auto has something to turn on."""
    return target.tokenize(" ".join([text] * times))


def top2_gap(model, prompt: list[int], generated: list[int]) -> float:
    """The target's top-2 logit gap before the last of `generated`, one token at a time."""
    ctx = model.new_context(512)
    try:
        logits = ctx.eval(prompt)[0]
        for t in generated[:-1]:
            logits = ctx.eval([t])[0]
        top = np.sort(logits)[-2:]
        return float(top[1] - top[0])
    finally:
        ctx.close()


class GpuLikeTimes:
    """Tells the policy GPU-like costs (a flat target pass, a cheap draft) instead of this
    CPU's: auto then speculates, and its adaptive choices (k from the acceptance seen so
    far, probes, on/off) are exercised on real models."""

    def __init__(self, policy: AutoPolicy):
        self.policy = policy

    sees_offers = True

    def see(self, name: str, offer: tuple[int, int]) -> None:
        self.policy.see(name, offer)

    def choose(self):
        return self.policy.choose()

    def observe(self, o: Outcome) -> None:
        self.policy.observe(replace(o, t_draft=2e-4 * o.n_drafted, t_verify=2e-3 + 2e-5 * o.n_drafted))

    def prefill(self, drafter: str, n_missing: int, max_tokens: int) -> bool:
        return self.policy.prefill(drafter, n_missing, max_tokens)

    def prefilled(self, drafter: str, n_tokens: int, seconds: float) -> None:
        self.policy.prefilled(drafter, n_tokens, 1e-5 * n_tokens)

    def finish(self) -> None:
        self.policy.finish()

    @property
    def predicted_tokens_per_s(self) -> float:
        return self.policy.predicted_tokens_per_s


class GpuLikeController(Controller):
    def policy(self, spec, drafter_names, temperature=0.0, prompt=None):
        return GpuLikeTimes(super().policy(spec, drafter_names, temperature, prompt))


CONTROLLERS = {"measured": Controller, "gpu_like": GpuLikeController}


def test_engine_defaults_to_the_adaptive_controller(tiny_models):
    engine = Engine(tiny_models["target"], tiny_models["draft_close"], n_ctx=256)
    assert isinstance(engine.policy_for(SpecParams()), AutoPolicy)  # mode auto is the default


@pytest.mark.parametrize("costs", list(CONTROLLERS))
def test_greedy_auto_equals_target_alone(tiny_models, costs):
    target = tiny_models["target"]
    slot = Engine(target, tiny_models["draft_close"], n_ctx=512, controller=CONTROLLERS[costs]()).new_slot()
    drafted = 0
    texts = ["the cat sat on the mat", "once upon a time there was a dog", "1 2 3 4 5 6", "hello world"]
    for text in texts * 2:  # the second round starts from what the controller learnt in the first
        prompt = repeating(target, text)
        params = SamplingParams(max_tokens=64, ignore_eos=True)
        reference = slot.generate(prompt, params, SpecParams(mode="none")).tokens
        g = slot.generate(prompt, params, SpecParams(mode="auto"))
        drafted += g.stats.n_drafted
        diverge = next((i for i, (a, b) in enumerate(zip(reference, g.tokens)) if a != b), None)
        if diverge is None:
            assert g.tokens == reference, text
        else:
            gap = top2_gap(target, prompt, reference[: diverge + 1])
            assert gap < EPS, f"{text!r}: diverged at token {diverge}, top-2 gap {gap:.4f}"
    slot.close()
    assert drafted > 0  # auto did speculate: the comparison means something


def exact_first_two(model, prompt: list[int], params: SamplingParams) -> dict[tuple[int, int], float]:
    """P(t1, t2) under the target alone, from its logits one token at a time."""
    ctx = model.new_context(256)
    try:
        p1 = process(ctx.eval(prompt)[0].copy(), params)
        joint = {}
        for t1 in np.flatnonzero(p1):
            ctx.truncate(len(prompt))
            p2 = process(ctx.eval([int(t1)])[0].copy(), params)
            for t2 in np.flatnonzero(p2):
                joint[(int(t1), int(t2))] = float(p1[t1] * p2[t2])
        return joint
    finally:
        ctx.close()


def tv(counts: dict, expected: dict, n: int) -> float:
    keys = set(counts) | set(expected)
    return 0.5 * sum(abs(counts.get(k, 0) / n - expected.get(k, 0.0)) for k in keys)


def tv_threshold(expected: dict, n: int, alpha: float = ALPHA) -> float:
    """A bound that the TV of n draws from `expected` exceeds with probability < alpha.

    E|p^ - p| <= min(sqrt(p (1 - p) / n), 2 p) per cell (Jensen; triangle inequality), so
    E[TV] <= sum / 2; one draw moves TV by at most 1/n, so by McDiarmid
    P(TV > E[TV] + t) <= exp(-2 n t^2), t = sqrt(ln(1 / alpha) / (2 n)).
    """
    mean = 0.5 * sum(min(math.sqrt(p * (1 - p) / n), 2 * p) for p in expected.values())
    return mean + math.sqrt(math.log(1 / alpha) / (2 * n))


SAMPLING = dict(temperature=1.0, top_k=5)  # 25 (t1, t2) cells: the bound is ~0.09 at N = 1500


@pytest.mark.parametrize("costs", list(CONTROLLERS))
def test_sampled_auto_is_lossless(tiny_models, costs):
    target = tiny_models["target"]
    engine = Engine(target, tiny_models["draft_close"], n_ctx=256, controller=CONTROLLERS[costs]())
    slot = engine.new_slot()
    prompt = repeating(target, "the cat sat on the mat")
    expected = exact_first_two(target, prompt, SamplingParams(**SAMPLING))
    counts: dict[tuple[int, int], int] = {}
    drafted = accepted = 0
    for seed in range(N_RUNS):
        g = slot.generate(prompt, SamplingParams(max_tokens=3, seed=seed, ignore_eos=True, **SAMPLING),
                          SpecParams(mode="auto"))
        key = (g.tokens[0], g.tokens[1])
        counts[key] = counts.get(key, 0) + 1
        drafted += g.stats.n_drafted
        accepted += g.stats.n_accepted
    slot.close()
    dist, limit = tv(counts, expected, N_RUNS), tv_threshold(expected, N_RUNS)
    print(f"{costs}: TV {dist:.4f} (limit {limit:.4f}), drafted {drafted}, accepted {accepted}")
    if costs == "gpu_like":  # auto speculated, and both the accept and the reject paths ran
        assert drafted > N_RUNS and 0 < accepted < drafted
    assert set(counts) <= set(expected), "a pair the target cannot produce"
    assert dist < limit


def test_tv_threshold_has_power(tiny_models):
    """The bound catches the classic bug: emitting the draft's tokens uncorrected (TV ~0.28)."""
    target = tiny_models["target"]
    prompt = repeating(target, "the cat sat on the mat")
    expected = exact_first_two(target, prompt, SamplingParams(**SAMPLING))
    wrong = exact_first_two(tiny_models["draft_close"], prompt, SamplingParams(**SAMPLING))
    keys = list(wrong)
    draws = np.random.default_rng(0).choice(len(keys), size=N_RUNS, p=np.array([wrong[k] for k in keys]))
    counts: dict = {}
    for i in draws:
        counts[keys[i]] = counts.get(keys[i], 0) + 1
    assert tv(counts, expected, N_RUNS) > tv_threshold(expected, N_RUNS)


def test_a_draft_model_in_use_takes_the_prompt_up_front(tiny_models):
    target, draft = tiny_models["target"], tiny_models["draft_close"]
    engine = Engine(target, draft, n_ctx=256)
    assert engine.controller.costs.cost_ratio["draft"] == pytest.approx(draft.weights_bytes / target.weights_bytes)
    slot = engine.new_slot()
    prompt = repeating(target, "the cat sat on the mat")
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    g = slot.generate(prompt, params, SpecParams(mode="none"))
    assert g.stats.t_prompt_draft == 0 and slot.draft_ctx.tokens == []  # no draft: left alone
    g = slot.generate(prompt, params, SpecParams(mode="draft", draft_max=4))
    assert 0 < g.stats.t_prompt_draft <= g.stats.t_draft  # counted as drafting, as llama-server does
    assert slot.draft_ctx.tokens[: len(prompt)] == prompt
    slot.close()
