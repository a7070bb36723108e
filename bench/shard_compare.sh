#!/usr/bin/env bash
# ddp.shard at 2 CPU ranks: per-rank memory (the plan's gradient and optimizer-state bytes, and
# the measured table) under none / optimizer / gradients, then samples/s of none against optimizer,
# alternated so that a change in the machine's load hits both alike. Prints the lines to quote in
# bench/RESULTS.md; the load average is printed before and after.
#   bench/shard_compare.sh [ROUNDS] [STEPS]   (default 3 rounds of 200 steps per config)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
rounds=${1:-3}
steps=${2:-200}
run() {  # CONFIG SHARD STEPS
  mpirun -np 2 "${TRAINER_BIN:-build/trainer}" --config "$1" --set ddp.shard="$2" --set train.steps="$3" --set train.warmup_steps=1 \
    --set train.eval_every=0 --set log.every=1000 --set log.progress=off --set log.metrics=off 2>&1
}
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for shard in none optimizer gradients; do
  out=$(run configs/gpt-tiny.yaml "$shard" 5)
  echo "gpt-tiny $shard: $(grep -o 'memory plan (rank 0): parameters [^,]*, gradient buckets [^,]*, optimizer state [^,]*' <<<"$out")"
  grep -A4 'memory before step 1' <<<"$out" | sed 's/^/    /'
done
for config in configs/mlp.yaml configs/gpt-tiny.yaml; do
  for round in $(seq "$rounds"); do
    for shard in none optimizer; do
      out=$(run "$config" "$shard" "$steps")
      echo "$config round $round $shard: $(grep -o '[0-9.]* samples/s' <<<"$out" | tail -1)"
    done
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
