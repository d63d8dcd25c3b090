"""The devices llama.cpp sees, whether this build can offload layers to a GPU, and where a model's layers went.

llama-cpp-python compiles llama.cpp on install, for the CPU unless CMAKE_ARGS names a GPU backend. A CPU
build given `-ngl 99` would load every layer on the CPU without a word (llama-server only warns, "no usable
GPU found, --gpu-layers option will be ignored"); here it is refused (`require_offload`), with the install
line that builds llama.cpp for this machine's GPU and the `-ngl 0` that keeps the CPU.

llama-cpp-python 0.3.36 binds no device enumeration, so the devices are read with ctypes from the ggml
backend registry in the library it ships (ggml_backend_dev_count/get/name/description/memory/type). A
library without those symbols gives one "CPU" device of unknown memory rather than an error.
"""
from __future__ import annotations

import ctypes
import os
import re
import shutil
import sys
from dataclasses import dataclass

import llama_cpp as C

# enum ggml_backend_dev_type (ggml-backend.h)
_KINDS = {0: "CPU", 1: "GPU", 2: "iGPU", 3: "accelerator", 4: "meta"}

# CMAKE_ARGS per GPU backend, as llama.cpp's CMake options name them in the llama.cpp that
# llama-cpp-python 0.3.36 vendors (GGML_HIPBLAS, older docs' name for ROCm, is no longer read there)
BACKEND_CMAKE_ARGS = {
    "CUDA": "-DGGML_CUDA=on",
    "Metal": "-DGGML_METAL=on",
    "Vulkan": "-DGGML_VULKAN=on",
    "ROCm": "-DGGML_HIP=on",
}


@dataclass(frozen=True)
class Device:
    """One ggml backend device. free/total: bytes, None where llama.cpp cannot tell (a CPU device reports
    the machine's RAM as both)."""

    name: str
    description: str
    kind: str  # CPU, GPU, iGPU, accelerator, meta
    free: int | None = None
    total: int | None = None

    def describe(self) -> str:
        from ..memory import fmt_bytes

        what = f"{self.name} ({self.description}" if self.description and self.description != self.name \
            else f"{self.name} ({self.kind}"
        if self.total and self.kind == "CPU":
            return f"{what}, {fmt_bytes(self.total)} RAM)"
        if self.total:
            return f"{what}, {fmt_bytes(self.free or 0)} free of {fmt_bytes(self.total)})"
        return what + ")"


class OffloadUnavailable(ValueError):
    """Layers were asked for on a GPU (-ngl/-ngld above 0) but this llama.cpp build cannot offload."""


def gpu_offload() -> bool:
    """Whether this llama-cpp-python build can put layers on a GPU (llama_supports_gpu_offload)."""
    try:
        return bool(C.llama_supports_gpu_offload())
    except (AttributeError, OSError):
        return False


def _fn(lib, name: str, restype, *argtypes):
    f = getattr(lib, name)  # AttributeError where the library lacks the symbol
    f.restype, f.argtypes = restype, list(argtypes)
    return f


def list_devices(lib=None) -> list[Device]:
    """The devices llama.cpp's ggml backend registry holds, GPUs first as llama.cpp lists them; one CPU
    device of unknown memory where the library does not export the registry's functions."""
    try:
        lib = lib if lib is not None else C.llama_cpp._lib  # libllama links ggml: its symbols resolve through it
        count = _fn(lib, "ggml_backend_dev_count", ctypes.c_size_t)
        get = _fn(lib, "ggml_backend_dev_get", ctypes.c_void_p, ctypes.c_size_t)
        name = _fn(lib, "ggml_backend_dev_name", ctypes.c_char_p, ctypes.c_void_p)
        desc = _fn(lib, "ggml_backend_dev_description", ctypes.c_char_p, ctypes.c_void_p)
        kind = _fn(lib, "ggml_backend_dev_type", ctypes.c_int, ctypes.c_void_p)
        memory = _fn(lib, "ggml_backend_dev_memory", None, ctypes.c_void_p,
                     ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t))
    except AttributeError:
        return [Device("CPU", "CPU only: this llama.cpp library does not list its devices", "CPU")]
    out = []
    for i in range(count()):
        dev = get(i)
        if not dev:
            continue
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        memory(dev, ctypes.byref(free), ctypes.byref(total))
        out.append(Device(name=(name(dev) or b"?").decode(errors="replace"),
                          description=(desc(dev) or b"").decode(errors="replace").strip(),
                          kind=_KINDS.get(kind(dev), "other"),
                          free=free.value or None, total=total.value or None))
    return out or [Device("CPU", "CPU only: llama.cpp lists no devices", "CPU")]


def offload_status(devices: list[Device], offload: bool) -> str:
    """Whether layers can leave the CPU here, and what to do about it."""
    gpus = [d for d in devices if d.kind in ("GPU", "iGPU")]
    if not offload:
        return "llama-cpp-python is built for the CPU only (to use a GPU: README.md, \"GPU\")"
    if not gpus:
        return "GPU offload is built in, but llama.cpp sees no GPU (driver? CUDA_VISIBLE_DEVICES?)"
    return f"GPU offload: -ngl N puts N of the target's layers on {gpus[0].name}, -ngld N the draft's"


def devices_line(devices: list[Device], offload: bool, layers: dict[str, int] | None = None) -> str:
    """One line for start-up: what llama.cpp sees, and whether layers leave the CPU. layers: flag -> value
    as given ({"-ngl": 0, "-ngld": 0}): where a GPU is seen and all are 0, the line says so (llama-server
    offloads by default; here -ngl 0 is the default)."""
    line = "devices: " + ", ".join(d.describe() for d in devices)
    gpus = [d for d in devices if d.kind in ("GPU", "iGPU")]
    if not offload or not gpus:
        line += "; " + offload_status(devices, offload)
    elif layers is not None and not any(layers.values()):
        line += f"; {' '.join(f'{f} 0' for f in layers)}: the models run on the CPU (-ngl 99 puts the target on " \
                f"{gpus[0].name})"
    return line


def layers_by_device(load_log: str) -> dict[str, int]:
    """How many of a model's layers llama.cpp assigned to each device, read from its load log
    ("layer 3 assigned to device CUDA0"; the output layer counts, as in llama.cpp's "offloaded 29/29")."""
    out: dict[str, int] = {}
    for dev in re.findall(r"layer\s+\d+ assigned to device (\S+?),", load_log):
        out[dev] = out.get(dev, 0) + 1
    return out


def placement(role: str, load_log: str) -> str | None:
    """'target 31/31 on CUDA0' (split: 'target 20/29 on CUDA0, 9/29 on CPU'), None where the log does not say."""
    by_dev = layers_by_device(load_log)
    if not by_dev:
        return None
    n = sum(by_dev.values())
    return f"{role} " + ", ".join(f"{k}/{n} on {d}" for d, k in by_dev.items())


def guess_backend() -> str:
    """The GPU backend this machine most likely wants: Metal on a Mac, ROCm where AMD's compute driver is
    (/dev/kfd) and NVIDIA's is not, else CUDA (the README lists the rest)."""
    if sys.platform == "darwin":
        return "Metal"
    if os.path.exists("/dev/kfd") and not (os.path.exists("/proc/driver/nvidia") or shutil.which("nvidia-smi")):
        return "ROCm"
    return "CUDA"


# ROCm: CMake needs ROCm's clang as its HIP compiler (llama.cpp's docs/build.md)
_BACKEND_ENV = {"ROCm": 'HIPCXX="$(hipconfig -l)/clang" HIP_PATH="$(hipconfig -R)" '}


def install_line(backend: str) -> str:
    """The pip line that rebuilds the installed llama-cpp-python for `backend`."""
    try:
        from importlib.metadata import version
        pin = "==" + version("llama-cpp-python")
    except Exception:  # not installed as a distribution (a source tree on sys.path): no pin
        pin = ""
    return (f'{_BACKEND_ENV.get(backend, "")}CMAKE_ARGS="{BACKEND_CMAKE_ARGS[backend]}" pip install '
            f"--force-reinstall --no-cache-dir llama-cpp-python{pin}")


def require_offload(layers: dict[str, int]) -> None:
    """Refuse GPU layers on a build that cannot offload them. layers: flag -> value, e.g. {"-ngl": 99};
    0 (the default) keeps a model on the CPU, a negative value asks for all layers (as llama.cpp's)."""
    asked = {flag: n for flag, n in layers.items() if n}
    if not asked or gpu_offload():
        return
    flags = " ".join(f"{f} {n if n > 0 else 'all'}" for f, n in asked.items())
    zero = " ".join(f"{f} 0" for f in asked)
    backend = guess_backend()
    others = ", ".join(b for b in BACKEND_CMAKE_ARGS if b != backend)
    raise OffloadUnavailable(
        f"{flags} {'asks' if len(asked) == 1 else 'ask'} for layers on a GPU, but this llama-cpp-python is built "
        f"for the CPU only "
        f"(llama_supports_gpu_offload() is False; llama.cpp sees: {', '.join(d.name for d in list_devices())}). "
        f"To use the GPU, rebuild it for {backend} (a compile of several minutes; {others}: README.md, \"GPU\"):\n"
        f"  {install_line(backend)}\n"
        f"To run on the CPU, leave out {flags} (or pass {zero}).")
