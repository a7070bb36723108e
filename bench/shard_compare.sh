#!/usr/bin/env bash
# ddp.shard on CPU ranks, in two parts. Prints the lines to quote in bench/RESULTS.md; the load
# average is printed before and after (a shared machine: compare the ratios, not the rates).
#   bench/shard_compare.sh speed [ROUNDS] [STEPS]   (default 3 rounds of 40 steps per mode)
#     gpt-3m (4 blocks, 256 wide, 4 heads, context 128, bytes, global batch 16) at 2 ranks under
#     none / optimizer / gradients / parameters, and parameters without prefetch
#     (ddp.prefetch_units: false), alternated round by round so that a change in the machine's
#     load hits every mode alike; samples/s from the 'done:' line (steps after the first).
#     MPI_PROGRESS=thread|caller (default thread): ddp.mpi_progress for every mode. A prefetched
#     all-gather moves on CPU only while something calls MPI: the progress thread does.
#   bench/shard_compare.sh memory
#     a 25.3M-parameter gpt (8 blocks, 512 wide) at 4 ranks: the per-rank tensor bytes the
#     trainer measures before step 1 and after the last step under each mode, against
#     16/4 bytes per parameter plus two gathered units for parameters.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
part=${1:-speed}
rounds=${2:-3}
steps=${3:-40}
trainer=${TRAINER_BIN:-build/trainer}
progress=${MPI_PROGRESS:-thread}
gpt3m=(--config configs/gpt-tiny.yaml --set model.num_layers=4 --set model.d_model=256
       --set model.heads=4 --set data.context=128 --set train.global_batch_size=16
       --set train.micro_batch_size=8 --set train.device=cpu --set train.warmup_steps=1
       --set train.eval_every=0 --set log.progress=off --set log.metrics=off
       --set ddp.mpi_progress="$progress")
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "$part" = speed ]; then
  for round in $(seq "$rounds"); do
    for mode in none optimizer gradients parameters parameters-noprefetch; do
      shard=${mode%-noprefetch}
      prefetch=true
      [ "$mode" = parameters-noprefetch ] && prefetch=false
      out=$(mpirun -np 2 "$trainer" "${gpt3m[@]}" --set ddp.shard="$shard" \
        --set ddp.prefetch_units="$prefetch" --set train.steps="$steps" --set log.every=1000 2>&1)
      echo "round $round $mode: $(grep -oE '[0-9.]+ samples/s' <<<"$out" | tail -1)"
    done
  done
else
  for shard in none gradients parameters; do
    out=$(mpirun -np 4 "$trainer" "${gpt3m[@]}" --set model.num_layers=8 --set model.d_model=512 \
      --set model.heads=8 --set data.context=64 --set train.global_batch_size=8 \
      --set train.micro_batch_size=2 --set ddp.shard="$shard" --set train.steps=2 \
      --set memory.check_every=1 --set log.every=1 2>&1)
    echo "== $shard"
    grep -E "parameters;|memory plan|per-rank state" <<<"$out" | sed 's/^.*\] //'
    grep -A5 -E "memory (before step 1|at step 2)" <<<"$out" | sed 's/^.*\] //'
  done
fi
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
