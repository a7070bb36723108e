#!/usr/bin/env bash
# How long a checkpoint stops training (issue 25, item 4): the 25.4M-parameter gpt of
# bench/shard_compare.sh's memory part (8 blocks, 512 wide, context 64) at 2 CPU ranks under
# ddp.shard: parameters, a checkpoint every CKPT_EVERY steps (default 2), for each of
# checkpoint.format single (gather to rank 0, rank 0 writes) and sharded (every rank its file),
# with checkpoint.async false and true, the four alternated round by round so that a change in the
# machine's load hits them alike. Prints one line per checkpoint from rank 0's log:
#   round R FORMAT sync|async step_N: stall S s = host copy H s + waited for the write W s +
#     vote and commit V s; file and fsync F s (in the background under async)
# where the stall is all that checkpoint cost the training thread: synchronous, the step's wait;
# asynchronous, the step's host copy plus, when the next checkpoint (or the end of the run)
# finishes it, the wait for the write and the vote. The load average is printed before and after
# (a shared machine: compare the ratios).
#   bench/checkpoint_stall.sh [ROUNDS] [STEPS]   (default 3 rounds of 6 steps per combination)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
rounds=${1:-3}
steps=${2:-6}
every=${CKPT_EVERY:-2}
trainer=${TRAINER_BIN:-build/trainer}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source bench/gpt25m.sh  # the model: gpt25m=(...)
gpt25m+=(--set ddp.shard=parameters --set checkpoint.every="$every" --set train.steps="$steps")
# Rank 0's "checkpoint written" lines (periodic ones) as the line format above.
parse() {
  local round=$1 format=$2 mode=$3
  grep -E "^\S+ \S+ \[0/2\] \[info\] checkpoint written: .*step_" | awk -v r="$round" \
    -v f="$format" -v m="$mode" '
    { match($0, /step_[0-9]+/); name = substr($0, RSTART, RLENGTH)
      n = split($0, w, " ") }
    m == "sync" {  # ..., the step waited T s: [gathers and ]host copy H s, file and fsync F s, vote and commit V s
      for (i = 1; i <= n; i++) {
        if (w[i] == "waited") t = w[i + 1]
        if (w[i] == "copy") h = w[i + 1]
        if (w[i] == "fsync") fs = w[i + 1]
        if (w[i] == "commit") v = w[i + 1]
      }
      printf "round %s %s sync %s: stall %.3f s = host copy %.3f s + waited for the write %.3f s + vote and commit %.3f s; file and fsync %.3f s\n", r, f, name, t, h, fs, v, fs }
    m == "async" {  # : the step waited H s (...); in the background, file and fsync F s; then the run waited W s for the write and V s for the vote and commit
      k = 0
      for (i = 1; i <= n; i++) {
        if (w[i] == "waited") { k++; if (k == 1) h = w[i + 1]; else wt = w[i + 1] }
        if (w[i] == "fsync") fs = w[i + 1]
        if (w[i] == "and" && w[i + 2] == "s" && w[i + 3] == "for" && w[i + 5] == "vote") v = w[i + 1]
      }
      printf "round %s %s async %s: stall %.3f s = host copy %.3f s + waited for the write %.3f s + vote and commit %.3f s; file and fsync %.3f s (in the background)\n", r, f, name, h + wt + v, h, wt, v, fs }'
}
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq "$rounds"); do
  for format in single sharded; do
    for mode in sync async; do
      rm -rf "${work:?}/ck"
      out=$(mpirun -np 2 "$trainer" "${gpt25m[@]}" --set checkpoint.format="$format" \
        --set checkpoint.async="$([ "$mode" = async ] && echo true || echo false)" \
        --set checkpoint.dir="$work/ck" 2>&1)
      parse "$round" "$format" "$mode" <<<"$out"
    done
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
