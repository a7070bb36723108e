#!/usr/bin/env bash
# How long a checkpoint stops the step (issue 25, item 4): the 25.4M-parameter gpt of
# bench/shard_compare.sh's memory part (8 blocks, 512 wide, context 64) at 2 CPU ranks under
# ddp.shard: parameters, a checkpoint after every step, checkpoint.format single (gather to rank
# 0, rank 0 writes) and sharded (every rank its file), alternated round by round so that a change
# in the machine's load hits both alike. Prints rank 0's per-checkpoint times from its
# "checkpoint written" lines: the step's wait, and for sharded its parts (host copy, file and
# fsync, vote and manifest). The load average is printed before and after (a shared machine:
# compare the ratios).
#   bench/checkpoint_stall.sh [ROUNDS] [STEPS]   (default 3 rounds of 3 steps per format)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
rounds=${1:-3}
steps=${2:-3}
trainer=${TRAINER_BIN:-build/trainer}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gpt25m=(--config configs/gpt-tiny.yaml --set model.num_layers=8 --set model.d_model=512
        --set model.heads=8 --set data.context=64 --set train.global_batch_size=8
        --set train.micro_batch_size=2 --set train.device=cpu --set train.warmup_steps=1
        --set train.eval_every=0 --set log.progress=off --set log.metrics=off
        --set ddp.shard=parameters --set checkpoint.every=1 --set train.steps="$steps")
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq "$rounds"); do
  for format in single sharded; do
    rm -rf "${work:?}/ck"
    out=$(mpirun -np 2 "$trainer" "${gpt25m[@]}" --set checkpoint.format="$format" \
      --set checkpoint.dir="$work/ck" 2>&1)
    grep -E "^\S+ \S+ \[0/2\] \[info\] checkpoint written: .*step_" <<<"$out" |
      sed -E "s/.*(step_[0-9]+)[^,]*, /round $round $format \1: /"
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
