#!/usr/bin/env bash
# LoRA against full fine-tuning on CPU ranks (issue 35). Prints the lines to quote in
# bench/RESULTS.md; the load average before and after (a shared machine: compare the ratios
# within a round, not the rates).
#   bench/lora_compare.sh [ROUNDS] [STEPS] [RANKS]   (default 2 rounds of 20 steps, 2 ranks)
#     llama-tiny (configs/llama-tiny.yaml: 4 blocks, 256 wide, 3.0M parameters) and a 25M llama
#     (8 blocks, 512 wide, 8 heads over 4, SwiGLU 1376, context 128), each full and with LoRA
#     (rank 8, alpha 16, the attention projections), alternated within a round so that a change
#     in the machine's load hits both alike: the memory plan's per-rank state (parameters,
#     gradients, AdamW state) and samples/s from the 'done:' line (steps after the first).
#   DEVICE=cuda (default cpu): on GPUs (one per rank), in bf16. MODELS="llama-tiny llama-25m
#     smollm" (the default: the first two): smollm is the llama at SmolLM-135M's shape with 2,048
#     positions; llama-1b the Llama-3.2-1B shape at 2,048 positions.
#   MODES="full lora full-graphs lora-graphs" (default: the first two): -graphs adds
#     train.cuda_graphs=true (CUDA only).
#   PROFILE=DIR: then, for the last of MODELS, a profiled run of each eager mode (steps 3-7 under
#     log.profile, a trace per mode in DIR) and bench/profile_summary.py over them side by side.
#     PROFILE_MODES="full-graphs lora-graphs" profiles those modes instead: under CUDA graphs the
#     phases outside the replayed forward and backward (clip, optimizer, data) are what it shows.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
rounds=${1:-2}
steps=${2:-20}
ranks=${3:-2}
trainer=${TRAINER_BIN:-build/trainer}
device=${DEVICE:-cpu}
precision=fp32
[ "$device" = cuda ] && precision=bf16
common=(--config configs/llama-tiny.yaml --set train.device="$device" --set train.precision="$precision"
        --set data.path=data/tokens-sample --set train.warmup_steps=1
        --set train.eval_every=0 --set train.sample_every=0 --set log.progress=off
        --set log.metrics=off --set train.global_batch_size=16 --set train.micro_batch_size=8
        --set log.every=1000)
declare -A models=(
  [llama-tiny]=""
  [llama-25m]="--set model.num_layers=8 --set model.d_model=512 --set model.heads=8
               --set model.kv_heads=4 --set model.intermediate_size=1376"
  [smollm]="--set model.preset=smollm-135m --set data.vocab_size=49152 --set data.context=2048"
  [llama-1b]="--set model.preset=llama-3.2-1b --set data.vocab_size=128256 --set data.context=2048"
)
# The keys of a mode: full, lora, full-graphs, lora-graphs.
read -ra modes <<<"${MODES:-full lora}"
declare -A mode_keys=()
for mode in "${modes[@]}"; do
  case $mode in full | full-graphs) mode_keys[$mode]="" ;;
    lora | lora-graphs) mode_keys[$mode]="--set model.lora_rank=8 --set model.lora_alpha=16" ;;
    *) echo "lora_compare.sh: unknown mode '$mode' in MODES (full, lora, full-graphs, lora-graphs)" >&2; exit 2 ;;
  esac
  [[ $mode == *-graphs ]] && mode_keys[$mode]+=" --set train.cuda_graphs=true"
done
read -ra profile_modes <<<"${PROFILE_MODES:-}"  # default: the eager modes
if [ ${#profile_modes[@]} -eq 0 ]; then
  for mode in "${modes[@]}"; do [[ $mode == *-graphs ]] || profile_modes+=("$mode"); done
fi
for mode in "${profile_modes[@]}"; do
  [ -n "${mode_keys[$mode]+set}" ] || { echo "lora_compare.sh: PROFILE_MODES names '$mode', not in MODES" >&2; exit 2; }
done
read -ra model_names <<<"${MODELS:-llama-tiny llama-25m}"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq "$rounds"); do
  for model in "${model_names[@]}"; do
    declare -A rates=()
    # shellcheck disable=SC2206  # the model's keys, split on purpose
    keys=(${models[$model]})
    for mode in "${modes[@]}"; do
      read -ra extra <<<"${mode_keys[$mode]}"
      out=$(mpirun -np "$ranks" "$trainer" "${common[@]}" "${keys[@]}" "${extra[@]}" \
        --set train.steps="$steps" 2>&1) ||
        { echo "round $round $model $mode FAILED:"; tail -3 <<<"$out"; continue; }
      rate=$(grep -oE '[0-9.]+ samples/s' <<<"$out" | tail -1)
      echo "round $round $model $mode: $rate"
      rates[$mode]=${rate% samples/s}
      if [ "$round" = 1 ]; then
        grep -E "model.lora:|memory plan|parameters;" <<<"$out" | sed 's/^.*\] /    /' | head -4
      fi
    done
    for lora_mode in lora lora-graphs; do  # step time = 1 / rate
      full_mode=full${lora_mode#lora}
      [ -n "${rates[$lora_mode]:-}" ] && [ -n "${rates[$full_mode]:-}" ] &&
        echo "round $round $model: $lora_mode step time / $full_mode = $(awk -v f="${rates[$full_mode]}" \
          -v l="${rates[$lora_mode]}" 'BEGIN { printf "%.3f", f / l }')"
    done
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ -n "${PROFILE:-}" ]; then
  rm -rf "$PROFILE" && mkdir -p "$PROFILE"
  model=${model_names[-1]}
  # shellcheck disable=SC2206
  keys=(${models[$model]})
  traces=()
  for mode in "${profile_modes[@]}"; do
    read -ra extra <<<"${mode_keys[$mode]}"
    mpirun -np "$ranks" "$trainer" "${common[@]}" "${keys[@]}" "${extra[@]}" \
      --set train.steps=8 --set log.profile="$PROFILE/$mode" >"$PROFILE/$mode.log" 2>&1 ||
      { echo "profiled $model $mode failed:"; tail -5 "$PROFILE/$mode.log"; continue; }
    traces+=("$mode=$PROFILE/$mode/trace_rank0.json")
  done
  echo "profile of $model (steps 3-7):"
  "${PYTHON:-python3}" bench/profile_summary.py "${traces[@]}"
fi
