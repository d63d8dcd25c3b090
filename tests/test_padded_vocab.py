"""Pairs whose vocabularies differ by padding speculate at temperature > 0.

Qwen2.5-7B (152064 tokens) with Qwen2.5-0.5B (151936) is such a pair: the pairing check
lets it through, so verification must align the two widths. The tiny padded models have
64 extra tokens with real output rows, so the padded side does produce them: the target
commits tokens the draft cannot evaluate, or the draft proposes tokens the target cannot
produce (p = 0: always rejected).
"""
from __future__ import annotations

import pytest

from equality import assert_same_sampled_text
from specserve.config import SamplingParams, SpecParams
from specserve.engine import Engine

PROMPTS = ["the cat sat on the mat", "once upon a time there was"]


@pytest.mark.parametrize("method", ["gumbel", "rejection"])
@pytest.mark.parametrize("target, draft", [("target_padded", "draft_close"), ("target", "draft_padded")])
def test_padded_pair_speculates_at_temperature(tiny_models, target, draft, method):
    model = tiny_models[target]
    slot = Engine(model, tiny_models[draft], n_ctx=256).new_slot()
    n_draft_vocab = tiny_models[draft].vocab.n_vocab
    drafted = accepted = beyond_draft = 0
    for text in PROMPTS:
        prompt = model.tokenize(text)
        for seed in range(8):
            params = SamplingParams(temperature=1.0, seed=seed, max_tokens=24, ignore_eos=True)
            g = slot.generate(prompt, params, SpecParams(mode="draft", draft_max=4), method)
            assert len(g.tokens) == 24 and all(0 <= t < model.vocab.n_vocab for t in g.tokens)
            drafted, accepted = drafted + g.stats.n_drafted, accepted + g.stats.n_accepted
            beyond_draft += sum(t >= n_draft_vocab for t in g.tokens)
            if method == "gumbel":  # the target alone's text for the seed, whatever was drafted
                alone = slot.generate(prompt, params, SpecParams(mode="none"), method).tokens
                assert_same_sampled_text(model, prompt, params, alone, g.tokens, 0.02, f"{text!r} seed {seed}")
    slot.close()
    assert 0 < accepted < drafted
    if target == "target_padded":
        assert beyond_draft > 0, "the target never produced a token the draft lacks: the test proves nothing"


def test_padded_pair_serves_greedy_and_sampled_over_the_same_slot(tiny_models):
    """Alternating requests on one slot: the draft's cache, holding stand-ins for tokens it lacks, stays usable."""
    model = tiny_models["target_padded"]
    slot = Engine(model, tiny_models["draft_close"], n_ctx=256).new_slot()
    prompt = model.tokenize("hello world hello")
    for i in range(6):
        params = SamplingParams(temperature=0.0 if i % 2 else 1.2, seed=i, max_tokens=16, ignore_eos=True)
        g = slot.generate(prompt, params, SpecParams(mode="draft", draft_max=3))
        assert len(g.tokens) == 16
    slot.close()
