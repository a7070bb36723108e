#!/usr/bin/env bash
# Runs the fuzz targets (tests/fuzz/; docs/DESIGN.md, "Tests and benchmarks": the fuzz tier) with
# libFuzzer, our code under AddressSanitizer and UndefinedBehaviorSanitizer.
#
#   scripts/fuzz.sh                      # every target, 60 s each
#   scripts/fuzz.sh TARGET [SECONDS]     # one target (safetensors_header, yaml_config, ...)
#   scripts/fuzz.sh all SECONDS          # every target, SECONDS each
#
# Builds build-fuzz with clang (-DTRAINER_FUZZ=ON) when needed (BUILD_JOBS, default all cores).
# Each target starts from its seed corpus (tests/fuzz/corpus/TARGET, read only) and the inputs of
# past findings (tests/fuzz/regressions/TARGET), and keeps what it learns in
# build-fuzz/corpus/TARGET. A finding is a crash, a sanitizer report, an input that takes over
# 10 s, or one that needs over 2 GB: libFuzzer writes it to build-fuzz/findings/TARGET/ and
# stops. Keep the input in tests/fuzz/regressions/TARGET/ with the fix, so that the `fuzz` ctest
# tier replays it. One line per target at the end: executions, coverage (edges), wall time, the
# log (build-fuzz/logs/TARGET.log). NICE (default 19), FUZZ_ARGS (more libFuzzer flags) and
# FUZZ_BUILD=0 (no build: run what is built) apply.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

target=${1:-all}
seconds=${2:-60}
build=${FUZZ_BUILD_DIR:-build-fuzz}
targets=$(sed -n 's/^  \([a-z0-9_]*\) trainer_[a-z]*$/\1/p' tests/fuzz/CMakeLists.txt)
if [ "$target" != all ] && ! grep -qx "$target" <<<"$targets"; then
  echo "scripts/fuzz.sh: unknown target '$target'; the targets are: ${targets//$'\n'/ }" >&2
  exit 2
fi
[ "$target" = all ] || targets=$target

if [ ! -f "$build/build.ninja" ]; then
  torch_cmake=$("$TRAINER_VENV/bin/python" -c \
    "import importlib.util, os; print(os.path.join(importlib.util.find_spec('torch').submodule_search_locations[0], 'share', 'cmake'))")
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=clang \
    -DCMAKE_CXX_COMPILER=clang++ -DTRAINER_FUZZ=ON -DCMAKE_PREFIX_PATH="$torch_cmake" >/dev/null
fi
# FUZZ_BUILD=0: run what is built (while another build of build-fuzz is under way).
if [ "${FUZZ_BUILD:-1}" != 0 ]; then
  # shellcheck disable=SC2046,SC2086  # one word per target
  cmake --build "$build" --target $(printf 'fuzz_%s ' $targets) -- -j"${BUILD_JOBS:-$(nproc)}"
fi

dictionary() {
  case $1 in
    safetensors_* | shard_manifest | hf_config | peft_config | tokenizer_json) echo json ;;
    yaml_config) echo yaml ;;
    png_image) echo png ;;
    token_shards) echo token_shards ;;
  esac
}

# The targets' scratch files (a reader that takes a path reads the input from one) in memory.
if [ -z "${TMPDIR:-}" ] && [ -w /dev/shm ]; then export TMPDIR=/dev/shm; fi
# Leaks are not findings (LibTorch keeps allocations until exit); every sanitizer report stops.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
status=0
for t in $targets; do
  mkdir -p "$build/corpus/$t" "$build/findings/$t" "$build/logs"
  args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048
    -print_final_stats=1 -artifact_prefix="$build/findings/$t/")
  dict=$(dictionary "$t")
  [ -z "$dict" ] || args+=(-dict="tests/fuzz/dict/$dict.dict")
  inputs=("$build/corpus/$t" "tests/fuzz/corpus/$t")
  [ ! -d "tests/fuzz/regressions/$t" ] || inputs+=("tests/fuzz/regressions/$t")
  log=$build/logs/$t.log
  start=$(date +%s)
  # shellcheck disable=SC2086  # FUZZ_ARGS: several flags
  if nice -n "${NICE:-19}" "$build/fuzz/fuzz_$t" "${args[@]}" ${FUZZ_ARGS:-} "${inputs[@]}" >"$log" 2>&1; then
    result=ok
  else
    result="FINDING (see $log and $build/findings/$t/)"
    status=1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  edges=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2 || true)
  echo "$t: ${runs:-?} executions, ${edges:-?} edges, $(($(date +%s) - start)) s: $result"
done
exit $status
