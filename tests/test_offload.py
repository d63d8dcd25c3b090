"""-ngl's split between GPU memory and RAM from the GGUF header (offload.py): llama.cpp's layer order, the input
layer kept in RAM, a tied output matrix copied to the GPU, KV cache with its layer."""
from __future__ import annotations

import dataclasses
import json

import pytest

from specserve.memory import ModelShape, estimate
from specserve.offload import LayerWeights, most_layers_within, split


@pytest.fixture(scope="module")
def model(tiny_paths):
    shape = ModelShape.from_gguf(tiny_paths["target"])
    return shape, LayerWeights.from_gguf(shape.path, shape.n_layer), estimate(shape, 512, repack=False)


def test_the_layers_add_up_to_the_file(model):
    shape, w, _ = model
    assert len(w.blocks) == shape.n_layer and all(w.blocks)
    assert w.input + sum(w.blocks) + w.output == shape.weights_bytes
    assert not w.tied_output  # the tiny model writes output.weight


def test_ngl_0_keeps_everything_in_ram_and_all_leaves_only_the_input_layer(model):
    shape, w, est = model
    none = split(shape, w, est, 0)
    assert (none.on_gpu, none.gpu, none.ram) == (0, 0, est.total)
    for ngl in (-1, shape.n_layer + 1, 99):
        every = split(shape, w, est, ngl)
        assert (every.on_gpu, every.n_layers) == (shape.n_layer + 1, shape.n_layer + 1)
        assert every.ram == w.input  # the token embeddings; no block, so no CPU compute buffer
        assert every.gpu == est.total - w.input


def test_ngl_1_is_the_output_layer_and_more_layers_move_from_the_end(model):
    shape, w, est = model
    one = split(shape, w, est, 1)
    assert one.gpu == w.output + est.compute  # no block: no KV cache on the GPU
    assert one.ram == est.total - w.output  # the blocks with their KV cache, and a CPU compute buffer
    two = split(shape, w, est, 2)
    kv_layer = est.kv // shape.n_layer
    assert two.gpu - one.gpu == w.blocks[-1] + kv_layer  # the last block first
    gpu = [split(shape, w, est, n).gpu for n in range(shape.n_layer + 2)]
    assert gpu == sorted(gpu)


def test_a_tied_output_layer_takes_a_copy_of_the_embeddings_to_the_gpu(model):
    shape, w, est = model
    tied = dataclasses.replace(w, output=w.output // 2, tied_output=True)
    assert split(shape, tied, est, 1).gpu == tied.output + w.input + est.compute
    assert split(shape, tied, est, 0).ram == est.total - w.output + tied.output  # in RAM, used in place


def test_repacked_copies_are_of_what_stays_on_the_cpu(model):
    shape, w, est = model
    w = dataclasses.replace(w, blocks_repack=tuple(b // 2 for b in w.blocks))
    est = dataclasses.replace(est, repacked=sum(w.blocks_repack), weights=est.weights + sum(w.blocks_repack))
    assert split(shape, w, est, 0).ram == est.total
    assert split(shape, w, est, -1).ram == w.input


def test_most_layers_within_a_gpu_budget(model):
    shape, w, est = model
    for ngl in range(1, shape.n_layer + 2):
        budget = split(shape, w, est, ngl).gpu
        assert most_layers_within(shape, w, est, budget) == ngl
    assert most_layers_within(shape, w, est, 0) == 0


def test_check_memory_only_prices_the_split_even_on_a_cpu_build(tiny_paths, capsys):
    """--memory-only loads nothing: -ngl there is a plan for another machine, never refused."""
    from specserve.cli import main

    argv = ["check", "--memory-only", "-m", str(tiny_paths["target"]), "-md", str(tiny_paths["draft_close"]),
            "-c", "512", "-ngl", "2", "-ngld", "all"]
    assert main([*argv, "--gpu-budget", "1GiB", "--json"]) == 0
    off = json.loads(capsys.readouterr().out)["memory"]["offload"]
    assert off["n_gpu_layers"] == {"target": 2, "draft": -1}
    assert off["target"]["on_gpu"] == 2 and off["draft"]["on_gpu"] == off["draft"]["n_layers"]
    assert off["fits"] and off["most_target_layers"] == off["target"]["n_layers"]
    assert off["gpu_bytes"] == off["target"]["gpu"] + off["draft"]["gpu"]
    assert main([*argv, "--gpu-budget", "64KiB"]) == 0
    out = capsys.readouterr().out
    assert "GPU offload (-ngl 2 -ngld all; estimated from the GGUF headers)" in out
    assert "GPU budget 64.0 KiB (--gpu-budget): does not fit" in out


def test_check_prices_each_compute_buffer_at_its_micro_batch(tiny_paths, capsys):
    """-ub/-ubd size the compute buffers the split puts on the GPU, as they size the memory report's."""
    from specserve.cli import main

    argv = ["check", "--memory-only", "-m", str(tiny_paths["target"]), "-md", str(tiny_paths["draft_close"]),
            "-c", "512", "-ngl", "all", "-ngld", "all", "--gpu-budget", "1GiB", "--json"]
    got = {}
    for ubd in (16, 512):
        assert main([*argv, "-ubd", str(ubd)]) == 0
        mem = json.loads(capsys.readouterr().out)["memory"]
        got[ubd] = mem["offload"]["draft"]["gpu"], mem["draft"]["compute"]
    assert got[512][1] > got[16][1]
    assert got[512][0] - got[16][0] == got[512][1] - got[16][1]
