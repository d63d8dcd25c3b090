"""A model whose memory cannot drop its last tokens (recurrent, as Mamba and RWKV; hybrid) never
produces wrong text: the cache is rebuilt where a prefix is reused, and speculation, which drops
rejected tokens every step, is refused with a clear message (auto simply does not speculate)."""
from __future__ import annotations

import numpy as np
import pytest

from specserve.config import SamplingParams, SpecParams
from specserve.engine import Engine


def test_truncating_a_recurrent_cache_rebuilds_it(tiny_models):
    model = tiny_models["mamba"]
    assert not model.can_rollback and tiny_models["target"].can_rollback
    ctx = model.new_context(128)
    tokens = model.tokenize("the cat sat on the mat")
    whole = ctx.eval(tokens, logits="all").copy()
    ctx.truncate(3)
    assert ctx.tokens == tokens[:3]
    again = ctx.eval(tokens[3:], logits="all")  # the state after 3 tokens, not after all of them
    assert np.allclose(again, whole[3:], atol=1e-4)
    ctx.close()


def test_prefix_reuse_on_a_recurrent_target_gives_the_fresh_text(tiny_models):
    model = tiny_models["mamba"]
    slot = Engine(model, None, n_ctx=128).new_slot()
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    first = slot.generate("the cat sat on the mat", params, SpecParams(mode="none"))
    reused = slot.generate("the cat sat in a box", params, SpecParams(mode="none"))  # shares "the cat sat"
    fresh = Engine(model, None, n_ctx=128).new_slot().generate("the cat sat in a box", params, SpecParams(mode="none"))
    assert reused.stats.n_cached > 0 and reused.tokens == fresh.tokens
    assert first.tokens  # (the first request filled the cache)


@pytest.mark.parametrize("mode", ["ngram", "draft"])
def test_speculation_on_a_recurrent_target_is_refused(tiny_models, mode):
    slot = Engine(tiny_models["mamba"], tiny_models["target"] if mode == "draft" else None, n_ctx=128).new_slot()
    with pytest.raises(ValueError, match="recurrent or hybrid memory"):
        slot.generate("hello world hello world", SamplingParams(max_tokens=8), SpecParams(mode=mode))


def test_auto_on_a_recurrent_target_does_not_speculate(tiny_models):
    model = tiny_models["mamba"]
    slot = Engine(model, None, n_ctx=128).new_slot()
    params = SamplingParams(temperature=0.8, seed=3, max_tokens=24, ignore_eos=True)
    alone = slot.generate("hello world hello world hello", params, SpecParams(mode="none"))
    auto = slot.generate("hello world hello world hello", params, SpecParams(mode="auto"))
    assert auto.tokens == alone.tokens and auto.stats.n_drafted == 0


def test_a_recurrent_draft_is_refused(tiny_models):
    with pytest.raises(ValueError, match="cannot draft"):
        Engine(tiny_models["target"], tiny_models["mamba"], n_ctx=128)
