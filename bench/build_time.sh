#!/usr/bin/env bash
# The build's time on this machine, unity batches on and off side by side (issue 40's targets: a
# one-line change in src/train/trainer.cpp rebuilds build/trainer in under 60 s warm):
#
#   bench/build_time.sh [TARGET]             (default: trainer)
#
# For TRAINER_UNITY_BUILD=ON and OFF, in a fresh build directory under /tmp each (the virtualenv
# and its LibTorch are reused; ccache is off, so every compile is real):
#   - the clean build of TARGET: wall time, and the compile time summed over translation units
#     (ninja's log), with the five slowest translation units;
#   - a one-line change in src/train/trainer.cpp (a comment line added, then removed): the rebuild
#     of TARGET, wall time.
# The machine may be shared: the load average before and after is printed with the times.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
target=${1:-trainer}
cd "$src"
source scripts/env.sh
export CCACHE_DISABLE=1
jobs=${BUILD_JOBS:-$(nproc)}
# ninja's log, one line per output: start and end (ms), mtime, output. The compile times of the
# translation units (.o files): their sum (s) and the slowest five.
compile_times() {
  awk 'NR > 1 && $4 ~ /\.o$/ { t = ($2 - $1) / 1000; s += t; printf "%8.1f  %s\n", t, $4 }
       END { printf "%8.1f  (sum over %d translation units)\n", s, NR - 1 }' "$1/.ninja_log" |
    sort -rn | head -6
}
seconds() { local t0=$1; awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
for unity in ON OFF; do
  dir=$(mktemp -d /tmp/build-time.XXXXXX)
  echo "== TRAINER_UNITY_BUILD=$unity ($dir, $jobs jobs; load: $(uptime | sed 's/.*load average: //'))"
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRAINER_UNITY_BUILD=$unity \
    -DCMAKE_PREFIX_PATH="$("$TRAINER_VENV/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')" \
    >"$dir/configure.log" 2>&1
  t0=$(date +%s.%N)
  ninja -C "$dir" -j"$jobs" "$target" >"$dir/build.log"
  echo "clean build of $target: $(seconds "$t0") s wall"
  compile_times "$dir"
  # A one-line change: a comment line, so the object changes for ccache-like caches but the code not.
  cp src/train/trainer.cpp "$dir/trainer.cpp.orig"
  trap 'cp "$dir/trainer.cpp.orig" src/train/trainer.cpp' EXIT
  printf '// build_time.sh %s\n' "$(date +%s%N)" >>src/train/trainer.cpp
  t0=$(date +%s.%N)
  ninja -C "$dir" -j"$jobs" "$target" >>"$dir/build.log"
  echo "one-line change in src/train/trainer.cpp, rebuild of $target: $(seconds "$t0") s wall"
  cp "$dir/trainer.cpp.orig" src/train/trainer.cpp
  trap - EXIT
  echo "load after: $(uptime | sed 's/.*load average: //')"
  rm -rf "$dir"
done
