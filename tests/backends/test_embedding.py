"""Embeddings pooled and normalized as llama-cpp-python's own `Llama.embed` computes them, on a tiny model."""
from __future__ import annotations

import numpy as np
import pytest

import llama_cpp as C
from specserve.backends import load_model
from specserve.backends.embedding import Embedder, normalize, pooling_of
from tiny_models import write_tiny_model

TEXTS = ["the quick brown fox", "hello world, hello again and again", "x"]


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return str(write_tiny_model(tmp_path_factory.mktemp("embed") / "m.gguf", seed=3))


@pytest.fixture(scope="module")
def model(path):
    m = load_model(path, n_threads=1)
    yield m
    m.close()


def reference(path: str, pooling: int, normalized: bool) -> list[np.ndarray]:
    """llama-cpp-python's Llama.embed: its own context, its tokenization."""
    llm = C.Llama(path, embedding=True, pooling_type=pooling, n_ctx=256, n_batch=256, n_ubatch=256, n_threads=1,
                  verbose=False)
    try:
        return [np.asarray(v) for v in llm.embed(TEXTS, normalize=normalized)]
    finally:
        llm.close()


@pytest.mark.parametrize("pooling", [C.LLAMA_POOLING_TYPE_MEAN, C.LLAMA_POOLING_TYPE_LAST, C.LLAMA_POOLING_TYPE_CLS])
def test_pooled_and_normalized_as_llama_embed(model, path, pooling):
    embedder = Embedder(model, 256)
    embedder.pooling = pooling
    try:
        raw = embedder.embed([model.tokenize(t) for t in TEXTS])
    finally:
        embedder.close()
    for a, b in zip(raw, reference(path, pooling, normalized=False)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    ours = [normalize(v) for v in raw]
    for a, b in zip(ours, reference(path, pooling, normalized=True)):
        assert a.shape == b.shape == (64,)
        np.testing.assert_allclose(a, b, atol=1e-5)
        assert np.linalg.norm(a) == pytest.approx(1.0, abs=1e-5)
    assert not np.allclose(ours[0], ours[1])  # different texts, different vectors


def test_a_causal_lm_is_mean_pooled_and_the_gguf_key_wins(model):
    assert pooling_of(model.metadata) == C.LLAMA_POOLING_TYPE_MEAN  # no pooling key: a causal LM
    assert pooling_of({"general.architecture": "bert", "bert.pooling_type": "2"}) == C.LLAMA_POOLING_TYPE_CLS
    assert pooling_of({"general.architecture": "bert", "bert.pooling_type": "0"}) == C.LLAMA_POOLING_TYPE_MEAN
    with pytest.raises(ValueError, match="reranker"):
        pooling_of({"general.architecture": "bert", "bert.pooling_type": "4"})


def test_the_same_input_gives_the_same_vector_and_generation_is_untouched(model):
    ctx = model.new_context(128)
    before = ctx.eval(model.tokenize("the quick"), logits="last").copy()
    embedder = Embedder(model, 128)
    try:
        a, b, c = embedder.embed([model.tokenize(TEXTS[0]), model.tokenize(TEXTS[1]), model.tokenize(TEXTS[0])])
        np.testing.assert_array_equal(a, c)  # the cache cleared between inputs
        after = ctx.eval(model.tokenize(" brown"), logits="last")
        fresh = model.new_context(128)
        expected = fresh.eval(model.tokenize("the quick") + model.tokenize(" brown"), logits="last")
        np.testing.assert_allclose(after, expected, atol=1e-4)
        fresh.close()
        assert before.shape == after.shape
        with pytest.raises(ValueError, match="1 to 128"):
            embedder.embed([list(range(10)) * 13])
    finally:
        embedder.close()
        ctx.close()
