"""Tests for specserve.gguf_meta against gguf.GGUFWriter / gguf.GGUFReader."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from specserve import gguf_meta as gm  # noqa: E402

N_BIG = 5000


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory):
    """A tiny llama-like GGUF with every scalar type, strings, small/large arrays, tensors."""
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -5)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 1.5)
    w.add_uint64("t.u64", 2**63 + 7)
    w.add_int64("t.i64", -(2**62))
    w.add_float64("t.f64", 3.141592653589793)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo ✓")
    w.add_array("t.small_ints", [1, 2, 3])
    w.add_array("t.small_strs", ["a", "bc", ""])
    w.add_key_value("t.small_f32", [0.5, -1.25], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.FLOAT32)
    w.add_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(N_BIG)])
    w.add_key_value("t.big_i32", list(range(N_BIG)), gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32)
    w.add_uint32("llama.block_count", 2)
    w.add_uint32("llama.embedding_length", 64)
    w.add_uint32("llama.attention.head_count", 4)
    w.add_uint32("llama.attention.head_count_kv", 2)
    w.add_uint32("llama.context_length", 256)
    w.add_tensor("norm.weight", np.ones(64, dtype=np.float32))
    w.add_tensor("w16", np.zeros((32, 64), dtype=np.float16))
    q = np.zeros((8, 64 // 32 * 20), dtype=np.uint8)  # 8 rows x 64 cols of Q4_1
    w.add_tensor("wq", q, raw_dtype=gguf.GGMLQuantizationType.Q4_1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_scalars_strings_and_small_arrays_match_reader(small_gguf):
    meta = gm.read_metadata(small_gguf)
    ref = gguf.GGUFReader(small_gguf)
    for key, field in ref.fields.items():
        if key.startswith("GGUF.") or key in ("tokenizer.ggml.tokens", "t.big_i32"):
            continue
        want = field.contents()
        if isinstance(want, float):
            assert meta[key] == pytest.approx(want), key
        elif isinstance(want, list) and want and isinstance(want[0], float):
            assert meta[key] == pytest.approx(want), key
        else:
            assert meta[key] == want, key
    assert meta["general.architecture"] == "llama"
    assert meta["t.str"] == "héllo ✓"
    assert meta["t.bool"] is True
    assert meta["t.small_strs"] == ["a", "bc", ""]


def test_large_arrays_are_summarised(small_gguf):
    meta = gm.read_metadata(small_gguf)
    toks = meta["tokenizer.ggml.tokens"]
    assert isinstance(toks, gm.ArraySummary)
    assert (toks.type, toks.length) == ("string", N_BIG)
    raw = b"".join(struct.pack("<Q", len(s)) + s.encode() for s in (f"tok{i}" for i in range(N_BIG)))
    assert toks.sha256 == hashlib.sha256(raw).hexdigest()
    big = meta["t.big_i32"]
    assert big == gm.ArraySummary("int32", N_BIG, hashlib.sha256(np.arange(N_BIG, dtype="<i4").tobytes()).hexdigest())


def test_full_arrays_on_request(small_gguf):
    ref = gguf.GGUFReader(small_gguf)
    meta = gm.read_metadata(small_gguf, full_arrays=("tokenizer.ggml.tokens",))
    assert meta["tokenizer.ggml.tokens"] == ref.fields["tokenizer.ggml.tokens"].contents()
    assert isinstance(meta["t.big_i32"], gm.ArraySummary)
    everything = gm.read_metadata(small_gguf, full_arrays=True)
    assert everything["t.big_i32"] == list(range(N_BIG))
    assert isinstance(gm.read_metadata(small_gguf, max_array_items=2)["t.small_ints"], gm.ArraySummary)


def test_header_types_and_layout(small_gguf):
    h = gm.read_header(small_gguf)
    assert h.version == 3
    assert h.types["t.u64"] == ("uint64", None)
    assert h.types["tokenizer.ggml.tokens"] == ("array", "string")
    ref = gguf.GGUFReader(small_gguf)
    assert h.data_offset == ref.data_offset


def test_tensor_infos_match_reader(small_gguf):
    infos = {t.name: t for t in gm.tensor_infos(small_gguf)}
    ref = gguf.GGUFReader(small_gguf)
    assert set(infos) == {t.name for t in ref.tensors}
    for t in ref.tensors:
        mine = infos[t.name]
        assert mine.shape == tuple(int(x) for x in t.shape)
        assert mine.ggml_type == t.tensor_type.name
        assert mine.n_bytes == t.n_bytes
        assert mine.n_elements == t.n_elements
        assert mine.offset == t.data_offset
    assert infos["wq"].n_bytes == 8 * 2 * 20
    assert infos["w16"].shape == (64, 32) and infos["w16"].n_bytes == 32 * 64 * 2


def test_summary(small_gguf):
    s = gm.summary(small_gguf)
    assert (s.architecture, s.n_layer, s.n_embd, s.n_head, s.n_head_kv) == ("llama", 2, 64, 4, 2)
    assert (s.head_dim_k, s.head_dim_v, s.context_length, s.vocab_size) == (16, 16, 256, N_BIG)
    assert s.file_size == small_gguf.stat().st_size
    assert s.n_params == 64 + 32 * 64 + 8 * 64
    assert s.kv_bytes_per_token == 2 * 2 * 2 * (16 + 16)
    assert s.as_dict()["vocab_size"] == N_BIG


def test_bad_files(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"NOPE" + b"\0" * 40)
    with pytest.raises(gm.GGUFError, match="not a GGUF"):
        gm.read_metadata(p)
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 100) + b"abc")
    with pytest.raises(gm.GGUFError):
        gm.read_metadata(p)
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 1, 0, 0))
    with pytest.raises(gm.GGUFError, match="version"):
        gm.read_metadata(p)
