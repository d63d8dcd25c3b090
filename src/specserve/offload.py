"""Partial offload: what lands in GPU memory and what stays in RAM for `-ngl N`, from the GGUF header alone.

llama.cpp counts a model's layers as its n_layer blocks plus the output layer, and offloads the last N of
them: `-ngl 1` puts only the output layer (the output matrix and its norm) on the GPU, `-ngl n_layer + 1`
(or `all`) everything but the input layer. The token embeddings (the input layer) always stay in RAM; where
the output matrix is tied to them (no `output.weight`: SmolLM2, Qwen2.5 0.5B-1.5B), an offloaded output layer
holds a second copy of them on the GPU. A layer's KV cache lives where the layer does (llama.cpp's default,
KV offload on). The compute buffer is on the GPU once anything is offloaded, and in RAM while any block stays
there; counting it whole on both sides when the blocks are split is an upper bound. The CPU backend's repacked
copy (memory.py) is kept only of the matrices that stay in RAM.
"""
from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass

from .memory import REPACKED_TYPES, MemoryEstimate, ModelShape

_BLOCK = re.compile(r"blk\.(\d+)\.")


@dataclass(frozen=True)
class LayerWeights:
    """A model's weights by llama.cpp layer, in bytes: blocks[i] is blk.i.*; repack the same for the part the
    CPU backend would copy; output: every tensor but the blocks and the input layer (token/position embeddings)."""

    blocks: tuple[int, ...]
    blocks_repack: tuple[int, ...]
    input: int
    output: int
    output_repack: int
    tied_output: bool  # no output.weight: the output layer uses the token embeddings

    @classmethod
    def from_gguf(cls, path: str | os.PathLike, n_layer: int) -> "LayerWeights":
        from .gguf_meta import read_header

        blocks, repack = [0] * n_layer, [0] * n_layer
        inp = out = out_repack = 0
        tied = True
        for t in read_header(path).tensors:
            size = max(t.n_bytes, 0)
            repackable = t.ggml_type in REPACKED_TYPES and len(t.shape) == 2 and t.shape[1] % 8 == 0
            m = _BLOCK.match(t.name)
            if m and int(m.group(1)) < n_layer:
                blocks[int(m.group(1))] += size
                repack[int(m.group(1))] += size if repackable else 0
            elif t.name.startswith(("token_embd", "position_embd")):
                inp += size
            else:
                out += size
                out_repack += size if repackable else 0
                tied = tied and t.name != "output.weight"
        return cls(tuple(blocks), tuple(repack), inp, out, out_repack, tied)


@dataclass(frozen=True)
class OffloadSplit:
    """One model at one context under -ngl N: bytes in GPU memory and in RAM."""

    n_gpu_layers: int  # as asked; -1: all
    on_gpu: int  # layers on the GPU, of n_layers (the blocks and the output layer), as llama.cpp counts them
    n_layers: int
    gpu: int
    ram: int

    def as_dict(self) -> dict:
        return asdict(self)


def split(shape: ModelShape, weights: LayerWeights, est: MemoryEstimate, n_gpu_layers: int) -> OffloadSplit:
    """Where `est` (the model at its context, memory.estimate) lands under -ngl n_gpu_layers."""
    n = shape.n_layer
    on_gpu = n + 1 if n_gpu_layers < 0 else min(n_gpu_layers, n + 1)
    first = n + 1 - on_gpu  # the first block on the GPU (llama.cpp's i_gpu_start)
    output_on_gpu = on_gpu >= 1
    blocks_on_gpu = max(0, n - first)
    repacked = est.repacked > 0  # this machine keeps a repacked copy of what stays on the CPU
    kv_per_layer = est.kv / n if n else 0
    gpu = sum(weights.blocks[first:]) + int(kv_per_layer * blocks_on_gpu)
    ram = weights.input + sum(weights.blocks[:first]) + int(kv_per_layer * (n - blocks_on_gpu))
    ram += sum(weights.blocks_repack[:first]) if repacked else 0
    if output_on_gpu:
        gpu += weights.output + (weights.input if weights.tied_output else 0)
    else:
        ram += weights.output + (weights.output_repack if repacked else 0)
    gpu += est.compute if output_on_gpu else 0
    ram += est.compute if first > 0 or not output_on_gpu else 0
    return OffloadSplit(n_gpu_layers, on_gpu, n + 1, gpu, ram)


def most_layers_within(shape: ModelShape, weights: LayerWeights, est: MemoryEstimate, gpu_bytes: int) -> int:
    """The largest -ngl whose GPU share fits in gpu_bytes (0 if not even the output layer does)."""
    for ngl in range(shape.n_layer + 1, 0, -1):
        if split(shape, weights, est, ngl).gpu <= gpu_bytes:
            return ngl
    return 0
