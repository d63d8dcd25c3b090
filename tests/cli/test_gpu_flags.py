"""-ngl/-ngld on a llama.cpp built for the CPU only, and the devices line, as a user meets them: every command
that takes the flags refuses GPU layers with the install line that fixes it, and names llama.cpp's devices."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specserve.backends import devices

cpu_build = pytest.mark.skipif(devices.gpu_offload(), reason="this llama-cpp-python can offload to a GPU")


def specserve(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "specserve", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


@cpu_build
@pytest.mark.parametrize("command, flags, said", [
    (["generate", "-p", "x"], ["-ngl", "99"], "-ngl 99"),
    (["generate", "-p", "x"], ["-ngld", "4"], "-ngld 4"),
    (["serve"], ["-ngl", "99"], "-ngl 99"),
    (["serve"], ["--gpu-layers", "all"], "-ngl all"),  # llama-server's spelling
    (["check"], ["-ngl", "99"], "-ngl 99"),
    (["bench", "--via", "inprocess"], ["-ngld", "99"], "-ngld 99"),
])
def test_gpu_layers_on_a_cpu_build_exit_2_with_the_fix(tiny_paths, command, flags, said):
    r = specserve(*command, "-m", tiny_paths["target"], "-md", tiny_paths["draft_close"], "-t", "1", *flags)
    assert r.returncode == 2, r.stderr
    assert r.stdout == ""
    first, fix, last = r.stderr.strip().splitlines()
    assert first.startswith(f"specserve: error: {said} asks for layers on a GPU, but this "
                            "llama-cpp-python is built for the CPU only")
    assert fix == "  " + devices.install_line(devices.guess_backend())
    assert last == f"To run on the CPU, leave out {said} (or pass {said.split()[0]} 0)."
    assert "memory:" not in r.stderr and "devices:" not in r.stderr  # refused before anything loads


def test_ngl_auto_is_refused_as_a_usage_error(tiny_paths):
    r = specserve("generate", "-m", tiny_paths["target"], "-p", "x", "-ngl", "auto")
    assert r.returncode == 2 and "auto (llama-server's fit to free memory) is not supported here" in r.stderr
    assert "memory:" not in r.stderr and "devices:" not in r.stderr  # refused before anything loads


def test_generate_names_the_devices_at_start_up(tiny_paths):
    r = specserve("generate", "-m", tiny_paths["target"], "-p", "the cat", "-n", "4", "--ignore-eos", "-t", "1",
                  "-ngl", "0")
    assert r.returncode == 0, r.stderr
    line = r.stderr.splitlines()[0]
    assert line.startswith("devices: ") and "CPU (" in line
    if not devices.gpu_offload():
        assert line.endswith('; llama-cpp-python is built for the CPU only (to use a GPU: README.md, "GPU")')


def test_check_has_a_devices_section(tiny_paths, capsys):
    from specserve.cli import main

    assert main(["check", "-m", str(tiny_paths["target"]), "-md", str(tiny_paths["draft_close"]), "-t", "1",
                 "-c", "256", "--no-measure"]) == 0
    out = capsys.readouterr().out
    section = out[out.index("\ndevices (llama.cpp)\n"):].splitlines()
    assert any(row.split()[:2] == ["CPU", "CPU"] for row in section), section
    assert main(["check", "-m", str(tiny_paths["target"]), "-t", "1", "-c", "256", "--no-measure", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["devices"]
    assert got["gpu_offload"] == devices.gpu_offload()
    assert any(d["kind"] == "CPU" and d["name"] for d in got["list"])


def test_where_the_layers_went_on_a_build_that_offloads(tiny_paths, capsys, monkeypatch):
    """A build that can offload says, after loading, how many layers each model has on each device (read
    from llama.cpp's load log); here, with no GPU to see, all on the CPU."""
    from specserve.cli.common import load_engine
    from specserve.config import ModelConfig

    monkeypatch.setattr(devices, "gpu_offload", lambda: True)
    engine = load_engine(ModelConfig(str(tiny_paths["target"]), str(tiny_paths["draft_close"]), n_ctx=64,
                                     n_threads=1, auto_profile=False))
    engine.close()
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("devices: CPU (") and err[0].endswith("llama.cpp sees no GPU (driver? "
                                                                    "CUDA_VISIBLE_DEVICES?)")
    n = devices.layers_by_device(engine.target.load_log)["CPU"]
    m = devices.layers_by_device(engine.draft.load_log)["CPU"]
    assert f"layers: target {n}/{n} on CPU; draft {m}/{m} on CPU" in err
