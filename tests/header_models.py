"""GGUF files that hold only a header: the shapes of models too big to download in a test.

`specserve check --memory-only` estimates memory from the header alone (memory.ModelShape), so a file
with a model's metadata and tensor infos, and no tensor data, stands for it. The shapes are those of
Qwen3-14B (Q4_K matrices, Q6_K output: about Q4_K_M; and as Q5_K_M, the seed's target) and Qwen3-0.6B
(Q8_0), the pair the draft-window issue starts from: 160 and 112 KiB of F16 cache a token.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q


@dataclass(frozen=True)
class Shape:
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    matrix_type: Q
    output_type: Q | None  # None: tied to the token embedding
    more_bits: Q | None = None  # attn_v and ffn_down of llama.cpp's use_more_bits layers (the _M mixes)


QWEN3_14B = Shape(40, 5120, 40, 8, 128, 17408, 151936, 40960, Q.Q4_K, Q.Q6_K)
# llama.cpp's Q5_K_M: Q5_K, with Q6_K for the output and for attn_v and ffn_down in the first and last
# eighth of the layers and every third between (10.5 GB, as the published Qwen3-14B-Q5_K_M.gguf)
QWEN3_14B_Q5_K_M = Shape(40, 5120, 40, 8, 128, 17408, 151936, 40960, Q.Q5_K, Q.Q6_K, Q.Q6_K)
QWEN3_0_6B = Shape(28, 1024, 16, 8, 128, 3072, 151936, 40960, Q.Q8_0, None)


def _info(w: gguf.GGUFWriter, name: str, rows: int, cols: int, qtype: Q) -> None:
    block, size = GGML_QUANT_SIZES[qtype]
    row_bytes = cols // block * size
    w.add_tensor_info(name, (rows, row_bytes), np.dtype(np.uint8), rows * row_bytes, raw_dtype=qtype)


def _use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's llama-quant.cpp: the layers an _M mix gives more bits to."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def write_header_only(path: str | Path, s: Shape, arch: str = "qwen3") -> Path:
    """A GGUF of `s`'s metadata and tensor infos, without tensor data (a few KiB)."""
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in (("block_count", s.n_layer), ("embedding_length", s.n_embd), ("context_length", s.n_ctx_train),
                       ("feed_forward_length", s.n_ff), ("attention.head_count", s.n_head),
                       ("attention.head_count_kv", s.n_head_kv), ("attention.key_length", s.head_dim),
                       ("attention.value_length", s.head_dim)):
        w.add_uint32(f"{arch}.{key}", value)
    w.add_uint32(f"{arch}.vocab_size", s.n_vocab)
    q, kv = s.n_head * s.head_dim, s.n_head_kv * s.head_dim
    _info(w, "token_embd.weight", s.n_vocab, s.n_embd, s.matrix_type)
    if s.output_type is not None:
        _info(w, "output.weight", s.n_vocab, s.n_embd, s.output_type)
    for i in range(s.n_layer):
        for name, rows, cols in (("attn_q", q, s.n_embd), ("attn_k", kv, s.n_embd), ("attn_v", kv, s.n_embd),
                                 ("attn_output", s.n_embd, q), ("ffn_gate", s.n_ff, s.n_embd),
                                 ("ffn_up", s.n_ff, s.n_embd), ("ffn_down", s.n_embd, s.n_ff)):
            more = s.more_bits is not None and name in ("attn_v", "ffn_down") and _use_more_bits(i, s.n_layer)
            _info(w, f"blk.{i}.{name}.weight", rows, cols, s.more_bits if more else s.matrix_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return Path(path)
