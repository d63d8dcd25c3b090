"""Memory arithmetic by hand on a tiny model, and the estimate against what llama.cpp allocates."""
from __future__ import annotations

import pytest

from specserve import memory
from specserve.memory import ModelShape, estimate, kv_cells, max_ctx_in_budget, parse_bytes

GiB, MiB = 1 << 30, 1 << 20


@pytest.mark.parametrize("text, expected", [
    ("24GiB", 24 * GiB), ("24G", 24 * GiB), ("24gib", 24 * GiB), ("8GB", 8 * 10**9), ("512 MiB", 512 * MiB),
    ("1.5GiB", int(1.5 * GiB)), ("1000", 1000), ("64k", 64 * 1024), ("2TiB", 2 << 40),
])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "12XB", "-1GiB", "0", "1.2.3G", "24 GiB of RAM"])
def test_parse_bytes_rejects(text):
    with pytest.raises(ValueError):
        parse_bytes(text)


@pytest.mark.parametrize("n_ctx, cells", [(1, 256), (64, 256), (256, 256), (257, 512), (1000, 1024), (2048, 2048)])
def test_kv_cells_padded_to_256(n_ctx, cells):
    assert kv_cells(n_ctx) == cells


def test_tiny_model_by_hand(tiny_paths):
    # tiny target: 2 layers, n_embd 64, 4 heads, 2 KV heads of dim 16, n_ff 128, 308 tokens, F32 weights
    shape = ModelShape.from_gguf(tiny_paths["target"])
    assert (shape.n_layer, shape.n_head, shape.n_head_kv, shape.head_dim_k, shape.head_dim_v) == (2, 4, 2, 16, 16)
    assert (shape.n_embd, shape.n_ff, shape.n_vocab) == (64, 128, 308)
    n_params = 308 * 64 * 2 + 64 + 2 * (64 + 64 * 64 + 2 * (32 * 64) + 64 * 64 + 64 + 3 * 128 * 64)
    assert shape.weights_bytes == 4 * n_params  # F32
    assert shape.kv_bytes_per_token() == 2 * 2 * (16 + 16) * 2 == 256  # layers * kv heads * (k + v) * F16
    assert shape.kv_bytes_per_token("q8_0") == 2 * 2 * 32 * 34 // 32  # 34-byte blocks of 32
    est = estimate(shape, 2048)
    assert est.kv == 256 * 2048
    # attention stage wins: 2048 cells x (4 heads + mask) + 7 x n_embd, x 4 bytes x 512-token micro-batch
    assert est.compute == 4 * 512 * (2048 * 5 + 7 * 64)
    assert est.total == est.weights + est.kv + est.compute
    small = estimate(shape, 100)  # micro-batch shrinks to the context; cells pad to 256
    assert small.kv == 256 * 256 and small.compute == 4 * 100 * (256 * 5 + 7 * 64)


def test_compute_stages():
    shape = ModelShape("x", n_layer=1, n_embd=32, n_head=2, n_head_kv=1, head_dim_k=16, head_dim_v=16,
                       n_ff=8192, n_vocab=300, n_ctx_train=1024, weights_bytes=0)
    assert shape.compute_bytes(2048) == 4 * 512 * (3 * 8192 + 2048 + 4 * 32)  # feed-forward stage
    wide_vocab = ModelShape(**{**shape.__dict__, "n_ff": 64, "n_vocab": 262144})
    assert wide_vocab.compute_bytes(2048) == 4 * 512 * (262144 + 2 * 32)  # output stage


def test_compute_scales_with_the_micro_batch():
    """Qwen2.5-Coder-0.5B's shape: llama.cpp reported 300.3 MiB at 512 tokens, 37.5 at 64, 9.4 at 16."""
    draft = ModelShape("x", n_layer=24, n_embd=896, n_head=14, n_head_kv=2, head_dim_k=64, head_dim_v=64,
                       n_ff=4864, n_vocab=151936, n_ctx_train=32768, weights_bytes=0)
    assert [round(draft.compute_bytes(4096, n) / MiB, 1) for n in (512, 64, 16)] == [300.2, 37.5, 9.4]
    assert draft.compute_bytes(4096, 4096) == draft.compute_bytes(4096, 512)  # a pass takes 512 tokens at most
    assert draft.compute_bytes(8, 16) == draft.compute_bytes(8, 8)  # nor more than the context
    assert estimate(draft, 4096, n_ubatch=16).compute == draft.compute_bytes(4096, 16)
    assert estimate(draft, 4096, n_ubatch=16).n_ubatch == 16


def test_max_ctx_in_budget_prices_each_model_at_its_micro_batch(tiny_paths):
    shape = ModelShape.from_gguf(tiny_paths["target"])
    budget = estimate(shape, 1024).total + estimate(shape, 1024, n_ubatch=16).total
    assert max_ctx_in_budget([shape, shape], budget, limit=8192, ubatches=[512, 16]) == 1024
    assert max_ctx_in_budget([shape, shape], budget, limit=8192) < 1024


@pytest.mark.parametrize("n_ctx", [2048, 8192])
def test_estimate_matches_llama_cpp_on_tiny_model(tiny_models, tiny_paths, n_ctx):
    est = estimate(ModelShape.from_gguf(tiny_paths["target"]), n_ctx)
    got = memory.measure(tiny_models["target"], n_ctx)
    for part in ("weights", "kv", "compute", "total"):
        assert abs(memory.relative_error(getattr(est, part), getattr(got, part))) < 0.10, part


def test_max_ctx_in_budget(tiny_paths):
    shape = ModelShape.from_gguf(tiny_paths["target"])
    at_1024 = estimate(shape, 1024).total
    assert max_ctx_in_budget([shape], at_1024, limit=8192) == 1024
    assert max_ctx_in_budget([shape], at_1024 - 1, limit=8192) == 768
    assert max_ctx_in_budget([shape], 100 * GiB, limit=8192) == 8192  # capped at the limit
    assert max_ctx_in_budget([shape], 1000, limit=8192) == 0  # not even the weights fit
    assert max_ctx_in_budget([shape, shape], at_1024, limit=8192) < 1024  # a draft costs context


def test_a_draft_window_costs_the_context_only_its_fixed_share(tmp_path, monkeypatch):
    """With --draft-ctx the draft's cache stops growing with the context: the largest context that fits
    is the target alone's in the budget less the draft at its window."""
    from header_models import QWEN3_0_6B, QWEN3_14B, write_header_only

    monkeypatch.setenv("SPECSERVE_EXTRA_BUFFERS", "0")  # as on a GPU: no repacked copy of the 14B's Q4_K
    target = ModelShape.from_gguf(write_header_only(tmp_path / "t.gguf", QWEN3_14B))
    draft = ModelShape.from_gguf(write_header_only(tmp_path / "d.gguf", QWEN3_0_6B))
    assert memory.cells(32768, 1024) == 1024 and memory.cells(512, 1024) == 512 and memory.cells(4096, 0) == 4096
    for budget in (12 * GiB, 14 * GiB, 16 * GiB):  # none capped at the training context
        at_window = estimate(draft, 1024, repack=False).total
        windowed = max_ctx_in_budget([target, draft], budget, 40960, windows=[0, 1024])
        assert windowed == max_ctx_in_budget([target], budget - at_window, 40960)
        assert max_ctx_in_budget([target, draft], budget, 40960) < windowed < max_ctx_in_budget([target], budget, 40960)


def test_loaded_summary_lists_each_part(tiny_paths):
    from specserve.config import ModelConfig
    from specserve.engine import Engine

    engine = Engine.load(ModelConfig(str(tiny_paths["target"]), str(tiny_paths["draft_close"]), n_ctx=2048,
                                     n_threads=1, draft_ctx=0))
    try:
        text = memory.loaded_summary(engine)
    finally:
        engine.close()
    target, draft, total = text.splitlines()
    assert target.startswith("memory: target target.gguf: weights ") and draft.startswith("memory: draft ")
    for line in (target, draft):
        assert "KV 256 B/token x 2048 = 512.0 KiB" in line and "compute " in line and "total " in line
    assert "(128 tokens at once)" in target and "(64 tokens at once)" in draft  # -ub, -ubd on a CPU
    assert total.startswith("memory: total ") and "context 2048" in total


def test_fmt_bytes():
    assert [memory.fmt_bytes(n) for n in (0, 1023, 1024, 1536 * MiB, 3 * GiB)] == \
        ["0 B", "1023 B", "1.0 KiB", "1.5 GiB", "3.0 GiB"]


def test_loaded_summary_prices_the_draft_at_its_window(tiny_paths):
    from specserve.config import ModelConfig
    from specserve.engine import Engine

    engine = Engine.load(ModelConfig(str(tiny_paths["target"]), str(tiny_paths["draft_close"]), n_ctx=2048,
                                     n_threads=1, draft_ctx=256))
    try:
        text = memory.loaded_summary(engine)
    finally:
        engine.close()
    target, draft, total = text.splitlines()
    assert "KV 256 B/token x 2048 = 512.0 KiB" in target
    assert "KV 256 B/token x 256 = 64.0 KiB" in draft and "its window, --draft-ctx 256" in draft
