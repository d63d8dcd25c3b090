"""The devices llama.cpp sees, and GPU layers refused on a build that cannot offload them (backends/devices.py)."""
from __future__ import annotations

import types

import pytest

from specserve.backends import devices
from specserve.backends.devices import Device, OffloadUnavailable

cpu_build = pytest.mark.skipif(devices.gpu_offload(), reason="this llama-cpp-python can offload to a GPU")


def test_llama_cpp_lists_at_least_the_cpu_with_a_name():
    listed = devices.list_devices()
    assert listed and all(d.name for d in listed)
    cpu = [d for d in listed if d.kind == "CPU"]
    assert cpu, listed
    assert cpu[0].total and cpu[0].total > 1 << 28  # the machine's RAM, as llama.cpp's CPU device reports it
    assert "RAM" in cpu[0].describe()


def test_a_library_without_the_device_api_degrades_to_cpu_only():
    listed = devices.list_devices(lib=types.SimpleNamespace())  # no ggml_backend_dev_* symbols
    assert [d.kind for d in listed] == ["CPU"] and "CPU only" in listed[0].description


def test_gpu_memory_is_free_of_total_and_the_line_says_when_ngl_0_leaves_it_idle():
    gpu = Device("CUDA0", "NVIDIA GeForce RTX 3090", "GPU", free=23 << 30, total=24 << 30)
    cpu = Device("CPU", "AMD Ryzen 9 5950X", "CPU", free=64 << 30, total=64 << 30)
    assert gpu.describe() == "CUDA0 (NVIDIA GeForce RTX 3090, 23.0 GiB free of 24.0 GiB)"
    line = devices.devices_line([gpu, cpu], offload=True, layers={"-ngl": 0, "-ngld": 0})
    assert line.startswith("devices: CUDA0 (NVIDIA GeForce RTX 3090, 23.0 GiB free of 24.0 GiB), CPU (")
    assert "-ngl 0 -ngld 0: the models run on the CPU (-ngl 99 puts the target on CUDA0)" in line
    assert "CPU only" not in devices.devices_line([gpu, cpu], offload=True, layers={"-ngl": 99})
    assert "built for the CPU only" in devices.devices_line([cpu], offload=False)
    assert "sees no GPU" in devices.devices_line([cpu], offload=True)


def test_layers_by_device_read_from_the_load_log(tiny_models):
    by_dev = devices.layers_by_device(tiny_models["target"].load_log)
    assert set(by_dev) == {"CPU"} and by_dev["CPU"] >= 2  # its blocks and the output layer
    log = "".join(f"load_tensors: layer {i:3d} assigned to device {'CUDA0' if i < 20 else 'CPU'}, is_swa = 0\n"
                  for i in range(29))
    assert devices.placement("target", log) == "target 20/29 on CUDA0, 9/29 on CPU"


def test_ngl_0_is_never_refused():
    devices.require_offload({"-ngl": 0, "-ngld": 0})


@cpu_build
@pytest.mark.parametrize("layers", [{"-ngl": 99}, {"-ngl": -1}, {"-ngl": 0, "-ngld": 5}])
def test_gpu_layers_on_a_cpu_build_are_refused_with_the_line_that_fixes_it(layers):
    with pytest.raises(OffloadUnavailable) as e:
        devices.require_offload(layers)
    msg = str(e.value)
    asked = " ".join(f"{f} {n if n > 0 else 'all'}" for f, n in layers.items() if n)  # -1: llama.cpp's all
    assert msg.startswith(f"{asked} asks for layers on a GPU")
    assert "llama_supports_gpu_offload() is False" in msg
    fix = devices.install_line(devices.guess_backend())
    assert f"\n  {fix}\n" in msg
    assert "pip install --force-reinstall --no-cache-dir llama-cpp-python==" in fix
    assert 'CMAKE_ARGS="-DGGML_' in fix
    assert msg.endswith(f"leave out {asked} (or pass {asked.split()[0]} 0).")


def test_each_backend_has_its_install_line():
    lines = {b: devices.install_line(b) for b in devices.BACKEND_CMAKE_ARGS}
    assert 'CMAKE_ARGS="-DGGML_CUDA=on" pip install --force-reinstall --no-cache-dir llama-cpp-python==' \
        in lines["CUDA"]
    assert '-DGGML_METAL=on' in lines["Metal"] and '-DGGML_VULKAN=on' in lines["Vulkan"]
    # ROCm: GGML_HIP (GGML_HIPBLAS, older docs' name, is no longer read), with ROCm's clang as the compiler
    assert '-DGGML_HIP=on' in lines["ROCm"] and lines["ROCm"].startswith('HIPCXX="$(hipconfig -l)/clang"')


@cpu_build
@pytest.mark.parametrize("field", ["n_gpu_layers", "n_gpu_layers_draft"])
def test_a_config_with_gpu_layers_is_refused_before_anything_loads(tiny_paths, field):
    from specserve.config import ModelConfig
    from specserve.loading import load_checked

    cfg = ModelConfig(str(tiny_paths["target"]), str(tiny_paths["draft_close"]), n_ctx=64, n_threads=1,
                      auto_profile=False, **{field: 99})
    with pytest.raises(OffloadUnavailable, match="-ngld 99" if field.endswith("draft") else "-ngl 99"):
        load_checked(cfg)


def test_the_readme_gives_the_lines_the_refusal_gives():
    """The refusal points at the README's "GPU" section: its install lines are the ones the error prints."""
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    section = readme[readme.index("\n## GPU\n"):].split("\n## ", 2)[1]
    for backend in ("CUDA", "Metal", "Vulkan"):
        assert f"`{devices.install_line(backend)}`" in section, backend
    rocm = devices.install_line("ROCm").replace('-DGGML_HIP=on"', '-DGGML_HIP=on -DGPU_TARGETS=gfx1100"')
    assert f"`{rocm}`" in section
