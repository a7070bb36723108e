#!/usr/bin/env bash
# The quick start from a fresh state, timed phase by phase (issue 40's target: its first sample in
# under 6 minutes on a 2-core machine, with the torch wheel not yet downloaded):
#
#   bench/fresh_quickstart.sh [REV]          (default: this checkout's HEAD)
#
# A fresh clone of REV in a temporary directory, run with empty caches: TRAINER_CACHE (the
# virtualenv with the wheel, GPT-2's ranks), CCACHE_DIR and PIP_CACHE_DIR, all under that directory,
# which is deleted at the end (several GB; KEEP=1 keeps it). The Debian packages stay installed:
# on a machine without them add the time `apt-get install` takes. Prints the quick start's output,
# each line with the seconds since the start, then the phases: the Debian packages check, pip
# installing torch, configure (CMake, barkeep's sdist included), the build of the trainer, the first
# sample, the first sample's total, and the load average before and after (the machine may be
# shared: record it with the times).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
rev=$(git -C "$src" rev-parse "${1:-HEAD}")
tmp=$(mktemp -d /tmp/fresh-quickstart.XXXXXX)
cleanup() { if [ "${KEEP:-0}" = 1 ]; then echo "kept $tmp"; else rm -rf "$tmp"; fi; }
trap cleanup EXIT
git clone -q --no-checkout "$src" "$tmp/clone"
git -C "$tmp/clone" checkout -q "$rev"
export TRAINER_CACHE=$tmp/cache CCACHE_DIR=$tmp/ccache PIP_CACHE_DIR=$tmp/pip
unset TRAINER_VENV BUILD_DIR
load_before=$(uptime)
start=$(date +%s.%N)
# Each line with the seconds since the start.
(cd "$tmp/clone" && scripts/quickstart.sh) 2>&1 | while IFS= read -r line; do
  printf '%7.1f %s\n' "$(awk -v s="$start" -v n="$(date +%s.%N)" 'BEGIN { print n - s }')" "$line"
done | tee "$tmp/log"
load_after=$(uptime)
# at PATTERN: the seconds of the first line matching PATTERN (ERE; -a: the untrained sample is
# not valid text).
at() { grep -a -m1 -E "^ *[0-9.]+ $1" "$tmp/log" | awk '{ print $1 }'; }
t_torch=$(at "\[bootstrap\] installing torch")
t_configure=$(at "\[bootstrap\] configuring")
t_build=$(at "\[bootstrap\] building")
t_sample=$(at "== A sample before training")
t_first=$(at "The parser")
t_end=$(tail -1 "$tmp/log" | awk '{ print $1 }')
span() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%6.1f s", b - a }'; }
echo
echo "rev $rev, $(nproc) cores ($(lscpu | sed -nE 's/^Model name: +//p'))"
echo "load before: $load_before"
echo "load after:  $load_after"
echo "Debian packages (check)   $(span 0 "$t_torch")"
echo "pip install torch         $(span "$t_torch" "$t_configure")"
echo "configure                 $(span "$t_configure" "$t_build")"
echo "build trainer             $(span "$t_build" "$t_sample")"
echo "first sample (--generate) $(span "$t_sample" "$t_first")"
echo "to the first sample       $(span 0 "$t_first")"
echo "whole quick start         $(span 0 "$t_end")"
du -sh "$TRAINER_CACHE" "$PIP_CACHE_DIR" "$CCACHE_DIR" 2>/dev/null || true
