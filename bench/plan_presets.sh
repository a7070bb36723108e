#!/usr/bin/env bash
# The planner's rows for every preset of the Llama block's families (issue 49: llama, qwen2,
# qwen3, mistral, gemma3): each preset on
# 8 x 80 GiB at 4096 positions, global batch 64, bf16, on CUDA, planned from the shapes on a
# machine without a GPU (--dry-run --plan-ranks 8 --plan-device-memory 80GiB), one process each
# under /usr/bin/time -v. Prints a Markdown row per preset: its parameters, the per-rank state
# under none and parameters, the micro-batch auto picks in each mode, wall time and peak RSS.
#   bench/plan_presets.sh [CONTEXT]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
bin=$(realpath "${TRAINER_BIN:-build/trainer}")
config=$PWD/configs/llama-tiny.yaml
context=${1:-4096}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rows=(
  "llama llama-3.2-1b 128256" "llama llama-3.1-8b 128256" "llama llama-3.1-70b 128256"
  "qwen2 qwen2.5-0.5b 151936" "qwen2 qwen2.5-1.5b 151936" "qwen2 qwen2.5-7b 152064"
  "qwen3 qwen3-0.6b 151936" "qwen3 qwen3-1.7b 151936" "qwen3 qwen3-4b 151936"
  "qwen3 qwen3-8b 151936" "qwen3 qwen3-14b 151936" "mistral mistral-7b-v0.3 32768"
  "gemma3 gemma-3-1b 262144" "gemma3 gemma-3-4b 262208"
)
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| preset | parameters | state per rank: none / parameters | micro-batch auto: none / optimizer / gradients / parameters | wall | peak RSS |"
echo "|---|---:|---|---|---:|---:|"
for row in "${rows[@]}"; do
  read -r family preset vocab <<<"$row"
  (cd "$work" && /usr/bin/time -v "$bin" --config "$config" \
    --set model.name="$family" --set model.preset="$preset" --set data.vocab_size="$vocab" \
    --set data.context="$context" --set train.global_batch_size=64 --set train.device=cuda \
    --set train.precision=bf16 --dry-run --plan-ranks 8 --plan-device-memory 80GiB \
    >"$work/out.log" 2>"$work/time.log") || { cat "$work/out.log" "$work/time.log"; exit 1; }
  params=$(grep -oE "model: [a-z0-9]+ [0-9.]+B parameters" "$work/out.log" | awk '{print $3}')
  # The plan's table: "MODE  PARAMETERS MiB  GRADIENTS MiB  OPTIMIZER MiB  TOTAL MiB  AUTO".
  mode() { sed -E 's/^\[[^]]*\] \[[^]]*\] \[info\] //' "$work/out.log" | grep -E "^$1 +[0-9]" | head -1; }
  state() { mode "$1" | grep -oE "[0-9.]+ MiB" | sed -n 4p; }
  auto() { mode "$1" | sed -E 's/.*MiB +//; s/ +\(in force\)//'; }
  wall=$(grep "Elapsed (wall clock)" "$work/time.log" | awk '{print $NF}')
  peak=$(grep "Maximum resident set size" "$work/time.log" | awk '{print $NF}')
  echo "| $preset | $params | $(state none) / $(state parameters) | $(auto none) / $(auto optimizer) / $(auto gradients) / $(auto parameters) | $wall | $((peak / 1024)) MiB |"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
