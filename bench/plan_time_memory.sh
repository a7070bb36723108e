#!/usr/bin/env bash
# Wall time and peak resident memory (/usr/bin/time -v) of the planning commands of issue 39 on a
# machine without a GPU, one process each: SmolLM-135M and Llama-3.2-1B at 2048 tokens on 8 x 80
# GiB (the commands a new user tried on a login node), configs/gpt2.yaml as shipped, and the
# Llama 3.1 8B and 70B shapes on 8 x 80 GB (bf16, activation checkpointing; 8B as torchtitan's
# published run: micro-batch 2 of 8192 tokens, global 16). Prints each command's line of the plan
# that matters and "TIME s, PEAK MiB".
#   bench/plan_time_memory.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
bin=$(realpath "${TRAINER_BIN:-build/trainer}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
plan=(--dry-run --plan-ranks 8 --plan-device-memory 80GiB)
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
measure() {
  local label=$1
  shift
  (cd "$work" && /usr/bin/time -v "$@" >"$work/out.log" 2>"$work/time.log") ||
    { cat "$work/out.log" "$work/time.log"; exit 1; }
  local wall peak
  wall=$(grep "Elapsed (wall clock)" "$work/time.log" | awk '{print $NF}')
  peak=$(grep "Maximum resident set size" "$work/time.log" | awk '{print $NF}')
  echo "== $label: wall $wall, peak $((peak / 1024)) MiB"
  grep -E "model: |ddp.shard +parameters|^.*(none|gradients|parameters) +[0-9]|micro_batch_size|fits|largest" \
    "$work/out.log" | sed -E 's/^\[[^]]*\] \[[^]]*\] \[info\] //'
}
llama=(--config "$PWD/configs/llama-tiny.yaml" --set train.device=cuda)
measure "smollm-135m, 2048 tokens, global 64" "$bin" "${llama[@]}" --set model.preset=smollm-135m \
  --set data.context=2048 --set train.global_batch_size=64 "${plan[@]}"
measure "llama-3.2-1b, 2048 tokens, global 64" "$bin" "${llama[@]}" --set model.preset=llama-3.2-1b \
  --set data.context=2048 --set train.global_batch_size=64 "${plan[@]}"
measure "configs/gpt2.yaml as shipped" "$bin" --config "$PWD/configs/gpt2.yaml" "${plan[@]}"
big=(--set model.tie_embeddings=false --set data.vocab_size=128256 --set train.precision=bf16 --set model.checkpoint_activations=true)
measure "llama-3.1-8b, 8192 tokens, micro 2, global 16, parameters" "$bin" "${llama[@]}" "${big[@]}" \
  --set model.preset=llama-3.1-8b --set data.context=8192 --set train.global_batch_size=16 \
  --set train.micro_batch_size=2 --set ddp.shard=parameters "${plan[@]}"
measure "llama-3.1-70b, 4096 tokens, micro 1, global 8, parameters" "$bin" "${llama[@]}" "${big[@]}" \
  --set model.preset=llama-3.1-70b --set data.context=4096 --set train.global_batch_size=8 \
  --set train.micro_batch_size=1 --set ddp.shard=parameters "${plan[@]}"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
