#!/usr/bin/env bash
# On a GPU machine of the `device` tool (CUDA toolkit, PyTorch in python3, CMake, ninja; no
# network, none of the trainer's Debian dependencies): unpacks the packages that
# scripts/device-deps.sh downloaded (carried as .device), builds the trainer against python3's
# LibTorch (or takes the one `pack` built here), and runs what needs a GPU. Logs go to $OUT (or
# ./device-out): the step logs in one device-logs.tgz, the summary on stdout.
#
#   device-check.sh pack     HERE, before the call: builds trainer, gpu_tests and the reducer
#                            bench in $BUILD_DIR (build) and copies them into .device/build, so
#                            the GPU machine spends no time compiling (this machine's wheel is the
#                            same LibTorch 2.11.0+cu130 as the GPU machine's python3)
#   device-check.sh build    unpack, and build (build-gpu/) unless .device/build holds a build
#   device-check.sh tests    the gpu tests, then tests/gpu/cuda_paths.sh (every CUDA path once)
#   device-check.sh bench    the GPU benchmarks (reducer overhead at world size 1; GPT-2 124M and
#                            the llama at SmolLM-135M's shape against PyTorch eager and compiled:
#                            bench/gpu_lm.sh)
#   device-check.sh all      build, tests and bench (default)
#   device-check.sh run CMD  CMD [ARGS] with the unpacked packages' MPI on PATH (a one-off
#                            measurement: bench/lora_compare.sh with its own settings, say)
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
  unpack
  local lib=$deps/usr/lib/x86_64-linux-gnu torch_lib nvidia
  export OPAL_PREFIX=$deps/usr
  # dpkg -x makes no alternatives: plain names for Open MPI's launcher and wrapper.
  mkdir -p "$deps/links"
  ln -sf "$deps/usr/bin/mpirun.openmpi" "$deps/links/mpirun"
  ln -sf "$deps/usr/bin/mpicc.openmpi" "$deps/links/mpicc"
  export PATH=$deps/links:$deps/usr/bin:$PATH
  # A packed build's runpath names this machine's wheel: python3's LibTorch, its NCCL and the
  # CUDA runtime stand in for it.
  torch_lib=$(python3 -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))")
  nvidia=$(dirname "$(dirname "$torch_lib")")/nvidia
  local extra=$torch_lib d
  for d in "$nvidia"/*/lib "$nvidia"/cu13/lib /usr/local/cuda/lib64; do [ -d "$d" ] && extra+=:$d; done
  export LD_LIBRARY_PATH=$lib:$lib/openmpi/lib:$extra${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OMPI_MCA_btl_vader_single_copy_mechanism=none
}

# The build the steps use: the one `pack` carried, else build-gpu/.
bin=build-gpu
[ -x .device/build/trainer ] && bin=.device/build

pack() {
  local from=${BUILD_DIR:-build}
  cmake --build "$from" --target trainer gpu_tests reducer_overhead_bench
  rm -rf .device/build
  mkdir -p .device/build/tests/gpu .device/build/bench
  cp "$from/trainer" .device/build/
  cp "$from/tests/gpu/gpu_tests" .device/build/tests/gpu/
  cp "$from/bench/reducer_overhead_bench" .device/build/bench/
  log "packed $(git describe --always --dirty) from $from: $(du -sh .device | cut -f1) in .device (carry it)"
}

build() {
  use_deps
  if [ "$bin" = .device/build ]; then
    log "using the packed build in .device/build (no compile here)"
    return
  fi
  local torch_prefix
  torch_prefix=$(python3 -c "import torch.utils; print(torch.utils.cmake_prefix_path)")
  if [ ! -f build-gpu/build.ninja ]; then
    cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$deps/usr;$torch_prefix" \
      -DMPI_C_COMPILER="$deps/usr/bin/mpicc.openmpi" -DMPIEXEC_EXECUTABLE="$deps/links/mpirun" 2>&1 | tee "$logs/configure.log" | grep -E "LibTorch|CUDA/NCCL|Error" || true
  fi
  cmake --build build-gpu --target trainer gpu_tests reducer_overhead_bench -- -j"$(nproc)" 2>&1 | tee "$logs/build.log" | tail -3
}

logs=/tmp/device-logs
mkdir -p "$logs"
failed=()
# Runs "$@" under a time limit of $LIMIT s (default 300), logging to $logs/NAME.log; a failure
# is remembered and the next steps still run.
step() {
  local name=$1; shift
  local t0=$SECONDS
  log "$name: $*"
  if ! timeout "${LIMIT:-300}" "$@" >"$logs/$name.log" 2>&1; then failed+=("$name"); log "$name FAILED (see $name.log)"; fi
  tail -"${TAIL:-12}" "$logs/$name.log"
  log "$name: $((SECONDS - t0)) s"
  # After every step: a call cut off at its time limit still brings back what ran.
  tar -czf "$out/device-logs.tgz" -C "$logs" .
}

tests() {
  use_deps
  nvidia-smi -L 2>&1 | tee "$logs/gpu.txt" || true
  LIMIT=150 step gpu-tests mpirun -np 1 "$bin/tests/gpu/gpu_tests"
  local cases
  read -ra cases <<<"${CASES:-}"  # CASES="a b": only those cases of cuda_paths.sh
  TAIL=20 LIMIT=200 LOGS=$logs/paths step cuda-paths tests/gpu/cuda_paths.sh "$bin" "${cases[@]}"
}

# BENCH="gpt2 reducer smollm" (the default): which benchmarks `bench` runs (gpt2 and smollm: each
# row the median of 3 rounds, the trainer's as 3 runs: LIMIT 300 and 240 s, from 200 and 150 s
# before the rounds, an estimate not yet measured on a GPU); "profile" adds the
# traced comparison of GPT-2 against PyTorch eager and compiled (bench/gpu_lm.sh with PROFILE),
# "lora" LoRA against full fine-tuning, eager and in CUDA graphs, and a profile of each eager
# step of the last model (bench/lora_compare.sh on CUDA; LORA_MODELS="llama-tiny llama-25m smollm
# llama-1b" and LORA_STEPS=20 by default, the first two issue 35's shapes, llama-1b the
# Llama-3.2-1B shape: about 270 s on an H200).
benches=" ${BENCH:-gpt2 reducer smollm} "
bench() {
  use_deps
  [[ $benches == *" gpt2 "* ]] && TAIL=16 LIMIT=300 BUILD_DIR=$bin OUT=$logs VARIANTS=1 step gpt2-vs-pytorch bench/gpu_lm.sh gpt2 "${GPT2_STEPS:-30}"
  [[ $benches == *" reducer "* ]] && LIMIT=60 step reducer-overhead-cuda mpirun -np 1 "$bin/bench/reducer_overhead_bench" --device cuda
  [[ $benches == *" smollm "* ]] && TAIL=12 LIMIT=240 BUILD_DIR=$bin OUT=$logs step smollm-vs-pytorch bench/gpu_lm.sh smollm "${LLAMA_STEPS:-30}"
  [[ $benches == *" lora "* ]] && TAIL=120 LIMIT=420 TRAINER_BIN=$bin/trainer DEVICE=cuda \
    MODELS="${LORA_MODELS:-llama-tiny llama-25m smollm llama-1b}" \
    MODES="full lora full-graphs lora-graphs" \
    PROFILE=/tmp/lora-traces step lora-vs-full bench/lora_compare.sh 1 "${LORA_STEPS:-20}" 1
  [[ $benches == *" profile "* ]] && TAIL=80 LIMIT=200 BUILD_DIR=$bin OUT=$logs PROFILE=/tmp/traces \
    step profile-gpt2 bench/gpu_lm.sh gpt2 12
  return 0
}

case $what in
  pack) pack; exit ;;
  build) build ;;
  tests) tests ;;
  bench) bench ;;
  all) build; tests; bench ;;
  run) shift; use_deps; exec "$@" ;;
  *) log "unknown step '$what' (pack, build, tests, bench, all, run)"; exit 2 ;;
esac
tar -czf "$out/device-logs.tgz" -C "$logs" . && log "logs: device-logs.tgz ($(du -sh "$out/device-logs.tgz" | cut -f1))"
if [ ${#failed[@]} -gt 0 ]; then log "failed: ${failed[*]}"; exit 1; fi
log "all steps passed"
