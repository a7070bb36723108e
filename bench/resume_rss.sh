#!/usr/bin/env bash
# Rank 0's resident memory while it trains after resuming from a single-file checkpoint: the
# checkpoint's tensors are applied at start-up and must not stay held for the whole run (12 bytes
# per parameter: the parameters and both AdamW moments). The 25.4M-parameter gpt of
# bench/gpt25m.sh trains 2 steps on 1 CPU rank and writes final.safetensors (about 300 MB); each
# binary then resumes from a copy of it and trains to step 8, and the step lines' "rss" (rank 0's
# VmRSS) is printed. "fresh" is the same run to step 4 without a checkpoint.
#   bench/resume_rss.sh [BEFORE_BINARY]
#   (BEFORE_BINARY: a trainer built from the commit before, to compare with)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
before=${1:-}
after=${TRAINER_BIN:-build/trainer}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source bench/gpt25m.sh  # the model: gpt25m=(...)
gpt25m+=(--set log.every=2 --set log.progress=lines)
"$after" "${gpt25m[@]}" --set train.steps=2 --set checkpoint.dir="$work/ck" >"$work/write.log" 2>&1 ||
  { cat "$work/write.log"; exit 1; }
echo "checkpoint: $(stat -c %s "$work/ck/final.safetensors") bytes"
# "LABEL step N rss M MiB" for each step line of one run.
rss() {
  local label=$1 bin=$2
  shift 2
  "$bin" "${gpt25m[@]}" "$@" >"$work/run.log" 2>&1 || { cat "$work/run.log"; exit 1; }
  grep -oE "step +[0-9]+/[0-9]+ .*rss [0-9]+ MiB" "$work/run.log" |
    sed -E "s|^step +([0-9]+)/[0-9]+ .*rss ([0-9]+) MiB|$label step \1 rss \2 MiB|"
}
resumed() {
  rm -rf "$work/resume" && cp -r "$work/ck" "$work/resume"
  rss "$1" "$2" --set train.steps=8 --set checkpoint.dir="$work/resume" \
    --set checkpoint.resume=auto --set checkpoint.every=0
}
rss fresh "$after" --set train.steps=4
[ -z "$before" ] || resumed before "$before"
resumed after "$after"
