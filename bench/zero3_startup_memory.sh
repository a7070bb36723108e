#!/usr/bin/env bash
# Peak resident memory per rank (VmHWM, /usr/bin/time's "maximum resident set size") from process
# start to the end of step 1 under ddp.shard: parameters, at 4 CPU ranks, on an 88.1M-parameter
# Llama (12 blocks, 768 wide, 12 heads over 4 kv heads, MLP 2048, vocabulary 16384, tied: the
# default model.tie_embeddings): the
# run is 1 step, no checkpoint, no validation data (the process ends after step 1). Issue 39: the
# model built without storage holds 16/4 bytes per parameter, two units and the activations; the
# build before it held the whole model until its broadcast (and copied it into the units).
# "runtime" is the same 4-rank start-up of a 2-block model of the same width (LibTorch, MPI and
# the loader: what every rank holds whatever the model).
#   bench/zero3_startup_memory.sh [ROUNDS] [BEFORE_BINARY]
#   (default 2 rounds; BEFORE_BINARY: a trainer built from the commit before, to compare with)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
rounds=${1:-2}
before=${2:-}
after=${TRAINER_BIN:-build/trainer}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/data"  # the training shard alone: no validation after step 1
ln -s "$PWD/data/tokens-sample/train_000000.bin" "$work/data/train_000000.bin"
llama=(--config configs/llama-tiny.yaml --set data.path="$work/data" --set train.device=cpu
  --set data.vocab_size=16384 --set data.context=128 --set model.num_layers=12 --set model.d_model=768
  --set model.heads=12 --set model.kv_heads=4 --set model.intermediate_size=2048
  --set train.global_batch_size=4 --set train.micro_batch_size=1 --set train.steps=1
  --set train.warmup_steps=0 --set train.eval_every=0 --set train.sample_every=0
  --set ddp.shard=parameters --set memory.cpu_budget_mb=0 --set log.progress=lines)
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
# Each rank's peak of one 4-rank run: "LABEL rank R max_rss_kib N".
peaks() {
  local label=$1 bin=$2
  shift 2
  # The single quotes are meant: each rank's own shell expands its rank.
  # shellcheck disable=SC2016
  mpirun -np 4 bash -c '/usr/bin/time -f "rank ${OMPI_COMM_WORLD_RANK} max_rss_kib %M" \
    -o "$0.rank${OMPI_COMM_WORLD_RANK}" "$@"' "$work/time" "$bin" "${llama[@]}" "$@" \
    >"$work/run.log" 2>&1 || { cat "$work/run.log"; exit 1; }
  grep -qE "step +1/1" "$work/run.log" || { cat "$work/run.log"; exit 1; }
  for r in 0 1 2 3; do echo "$label $(tail -1 "$work/time.rank$r")"; done
}
for round in $(seq "$rounds"); do
  peaks "round $round runtime" "$after" --set model.num_layers=2 --set data.vocab_size=256
  [ -z "$before" ] || peaks "round $round before" "$before"
  peaks "round $round after" "$after"
done
grep -E "model llama: [0-9]+ parameters" "$work/run.log" | sed -E 's/.*(model llama: [0-9]+ parameters).*/\1/'
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
