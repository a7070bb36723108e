#!/usr/bin/env bash
# On a GPU machine of the `device` tool (CUDA toolkit, PyTorch in python3, CMake, ninja; no
# network, none of the trainer's Debian dependencies): unpacks the packages that
# scripts/device-deps.sh downloaded (carried as .device), builds the trainer against python3's
# LibTorch, and runs what needs a GPU. Logs go to $OUT (or ./device-out).
#
#   device-check.sh build    unpack and build (build-gpu/)
#   device-check.sh tests    the gpu tests (ctest -L gpu) and a CUDA quickstart
#   device-check.sh bench    the GPU benchmarks (reducer overhead at world size 1; GPT-2 124M
#                            against PyTorch eager and compiled: bench/gpu_gpt2.sh)
#   device-check.sh all      all three (default)
#
# One `run` call, for example:
#   carry: [".device"]   command: "scripts/device-check.sh all"
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
out=${OUT:-$PWD/device-out}
mkdir -p "$out"
deps=/tmp/trainer-deps
log() { echo "[device-check] $*"; }

unpack() {
  [ -f "$deps/.done" ] && return
  ls .device/debs/*.deb >/dev/null 2>&1 || { log "no .device/debs: run scripts/device-deps.sh here and carry .device"; exit 2; }
  mkdir -p "$deps"
  for f in .device/debs/*.deb; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$f" "$deps"
    else  # a deb is an ar archive holding data.tar.*
      (cd "$deps" && { ar p "$OLDPWD/$f" "$(ar t "$OLDPWD/$f" | grep '^data.tar')" | tar -x --auto-compress -f - 2>/dev/null ||
        ar p "$OLDPWD/$f" "$(ar t "$OLDPWD/$f" | grep '^data.tar')" | tar -xJ; })
    fi
  done
  touch "$deps/.done"
  log "unpacked $(find .device/debs -name '*.deb' | wc -l) packages into $deps"
}

# Open MPI finds its components and help files relative to OPAL_PREFIX once moved.
use_deps() {
  local lib=$deps/usr/lib/x86_64-linux-gnu
  export OPAL_PREFIX=$deps/usr
  # dpkg -x makes no alternatives: plain names for Open MPI's launcher and wrapper.
  mkdir -p "$deps/links"
  ln -sf "$deps/usr/bin/mpirun.openmpi" "$deps/links/mpirun"
  ln -sf "$deps/usr/bin/mpicc.openmpi" "$deps/links/mpicc"
  export PATH=$deps/links:$deps/usr/bin:$PATH
  export LD_LIBRARY_PATH=$lib:$lib/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OMPI_MCA_btl_vader_single_copy_mechanism=none
}

build() {
  unpack
  use_deps
  local torch_prefix
  torch_prefix=$(python3 -c "import torch.utils; print(torch.utils.cmake_prefix_path)")
  if [ ! -f build-gpu/build.ninja ]; then
    cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$deps/usr;$torch_prefix" \
      -DMPI_C_COMPILER="$deps/usr/bin/mpicc.openmpi" -DMPIEXEC_EXECUTABLE="$deps/links/mpirun" 2>&1 | tee "$out/configure.log" | grep -E "LibTorch|CUDA/NCCL|Error" || true
  fi
  cmake --build build-gpu -- -j"$(nproc)" 2>&1 | tee "$out/build.log" | tail -3
}

failed=()
# Runs "$@", logging to $out/NAME.log; a failure is remembered and the next steps still run.
step() {
  local name=$1; shift
  log "$name: $*"
  if ! "$@" > "$out/$name.log" 2>&1; then failed+=("$name"); log "$name FAILED (see $name.log)"; fi
  tail -"${TAIL:-12}" "$out/$name.log"
}

tests() {
  use_deps
  nvidia-smi -L 2>&1 | tee "$out/gpu.txt" || true
  step gpu-tests ctest --test-dir build-gpu -L gpu --output-on-failure
  step quickstart-cuda mpirun -np 1 build-gpu/trainer --config configs/mlp.yaml --set train.device=cuda
}

bench() {
  use_deps
  step reducer-overhead-cuda mpirun -np 1 build-gpu/bench/reducer_overhead_bench --device cuda
  # GPT-2 124M, seq 1024, one GPU: the trainer against PyTorch eager and torch.compile.
  TAIL=20 BUILD_DIR=build-gpu step gpt2-vs-pytorch bench/gpu_gpt2.sh "${GPT2_STEPS:-40}" "${GPT2_MICRO:-16}"
}

case $what in
  build) build ;;
  tests) tests ;;
  bench) bench ;;
  all) build; tests; bench ;;
  *) log "unknown step '$what' (build, tests, bench, all)"; exit 2 ;;
esac
if [ ${#failed[@]} -gt 0 ]; then log "failed: ${failed[*]}"; exit 1; fi
log "all steps passed"
