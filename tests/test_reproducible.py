"""Same seed, same text, at temperature > 0, whatever speculation did.

Under --verify gumbel (the default) every token is the target's own draw for its
position and seed, so the text is the target alone's: across processes, across
--spec modes, and under --spec auto, whose choices depend on measured wall-clock costs.
Batched passes can part from one-token passes at near-ties (equality.py).
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from equality import assert_same_sampled_text
from specserve.config import SamplingParams, SpecParams
from specserve.engine import Engine

EPS = 0.02  # the tiny models' batched and one-token logits differ by up to ~3e-3 (F16 KV cache)
SAMPLINGS = [dict(temperature=0.8), dict(temperature=0.7, top_k=20, top_p=0.9, min_p=0.05), dict(temperature=1.5)]


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_every_spec_mode_gives_the_target_alones_text(tiny_models, sampling):
    target = tiny_models["target"]
    slot = Engine(target, tiny_models["draft_close"], n_ctx=256).new_slot()
    drafted = 0
    for text in ("the cat sat on the mat", "hello world hello world"):
        prompt = target.tokenize(text)
        for seed in range(6):
            params = SamplingParams(seed=seed, max_tokens=32, ignore_eos=True, **sampling)
            alone = slot.generate(prompt, params, SpecParams(mode="none")).tokens
            for mode, k in (("draft", 4), ("ngram", 6), ("auto", 8), ("draft", 1)):
                g = slot.generate(prompt, params, SpecParams(mode=mode, draft_max=k))
                drafted += g.stats.n_drafted
                assert_same_sampled_text(target, prompt, params, alone, g.tokens, EPS, f"{mode} k={k} seed {seed}")
    slot.close()
    assert drafted > 0


def generate(paths, *args) -> list[int]:
    r = subprocess.run([sys.executable, "-m", "specserve", "generate", "-m", str(paths["target"]),
                        "-md", str(paths["draft_close"]), "-p", "once upon a time there was", "-n", "40",
                        "--temp", "0.9", "--top-k", "40", "--seed", "11", "--ignore-eos", "-t", "1", "--json", *args],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["tokens"]


def test_same_seed_same_text_across_processes_and_modes(tiny_paths, tiny_models):
    runs = {mode: generate(tiny_paths, "--spec", mode) for mode in ("none", "auto", "draft", "ngram")}
    assert generate(tiny_paths, "--spec", "auto") == runs["auto"]  # another process: the very same tokens
    target = tiny_models["target"]
    prompt = target.tokenize("once upon a time there was")
    params = SamplingParams(temperature=0.9, top_k=40, seed=11)
    for mode in ("auto", "draft", "ngram"):
        assert_same_sampled_text(target, prompt, params, runs["none"], runs[mode], EPS, mode)


def test_rejection_sampling_is_reproducible_for_a_fixed_drafter(tiny_paths):
    """--verify rejection: the same seed and drafter give the same text (but not the target alone's)."""
    a = generate(tiny_paths, "--spec", "draft", "--verify", "rejection")
    assert generate(tiny_paths, "--spec", "draft", "--verify", "rejection") == a


def test_the_choices_of_one_request_differ_and_each_reproduces(tiny_models):
    """n > 1 under gumbel: choice j samples with choice_seed(seed, j); choice 0 is the request alone."""
    from specserve.sampling import choice_seed

    target = tiny_models["target"]
    slot = Engine(target, tiny_models["draft_close"], n_ctx=256).new_slot()
    prompt = target.tokenize("once upon a time there was")

    def choice(j: int, mode: str) -> list[int]:
        params = SamplingParams(temperature=1.0, seed=choice_seed(7, j), max_tokens=24, ignore_eos=True)
        return slot.generate(prompt, params, SpecParams(mode=mode, draft_max=4)).tokens

    texts = [choice(j, "none") for j in range(4)]
    assert texts[0] == slot.generate(prompt, SamplingParams(temperature=1.0, seed=7, max_tokens=24, ignore_eos=True),
                                     SpecParams(mode="none")).tokens
    assert len({tuple(t) for t in texts}) == 4
    assert choice(2, "draft") == texts[2] and choice_seed(None, 3) is None and choice_seed(7, 2) == choice_seed(7, 2)
    slot.close()
