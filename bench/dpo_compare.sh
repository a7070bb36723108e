#!/usr/bin/env bash
# A DPO step against an SFT step on the same tokens, and DPO's memory under LoRA against full
# fine-tuning with the precomputed reference (issue 50), on CPU ranks at the llama-tiny shape
# (configs/llama-tiny.yaml: 4 blocks, 256 wide; the sample chat tokenizer's 2,048 ids). Prints the
# lines to quote in bench/RESULTS.md and the load average before and after (a shared machine:
# compare within a round).
#   bench/dpo_compare.sh [ROUNDS] [STEPS] [RANKS]   (default 2 rounds of 20 steps, 2 ranks)
# The data: data/preference-sample tokenized with --preference at --max-tokens 129 (each sequence
# a row of 128 positions); the SFT runs read the same shards without their .pairs files as chat
# data (data.packing: none: windows of 128 positions cut from the same token stream), 2 G windows
# a step against DPO's G pairs (2 G rows): the same positions per step. Modes, alternated within a
# round: sft (train.objective: lm), dpo-lora (LoRA rank 8 on the attention projections: the
# reference is the base with the adapters off), dpo-full (every weight: the reference
# precomputed before step 1), simpo-lora. Each: ms per step from the 'done:' line (the steps after
# the first) and the peak RSS of rank 0 (the last memory table's "peak rss").
set -euo pipefail
read -r rounds steps ranks <<<"${1:-2} ${2:-20} ${3:-2}"
pairs=16  # G
trainer=${TRAINER_BIN:-build/trainer}
cd "$(dirname "$0")/.."
source scripts/env.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tok=data/chat-sample/tokenizer/tokenizer.json
"$TRAINER_VENV/bin/python" scripts/tokenize_text.py --preference --tokenizer "$tok" --max-tokens 129 \
  data/preference-sample/pairs.jsonl "$work/pairs" >/dev/null
mkdir -p "$work/chat"
for f in "$work"/pairs/*; do
  case $f in *.pairs) ;; *) cp "$f" "$work/chat/" ;; esac
done
common=(--config configs/llama-tiny.yaml --set train.device=cpu --set data.vocab_size=2048
        --set data.context=128 --set data.tokenizer="$tok" --set train.steps="$steps"
        --set train.warmup_steps=1 --set train.eval_every=0 --set train.sample_every=0
        --set log.progress=off --set log.metrics=off --set log.every=1000 --set data.workers=1)
lora="--set model.lora_rank=8 --set model.lora_alpha=16 --set model.lora_targets=[q_proj,k_proj,v_proj,o_proj]"
declare -A modes=(
  [sft]="--set data.path=$work/chat --set data.packing=none --set train.global_batch_size=$((2 * pairs)) --set train.micro_batch_size=$((2 * pairs / ranks))"
  [dpo-lora]="--set data.path=$work/pairs --set train.objective=dpo --set train.global_batch_size=$pairs --set train.micro_batch_size=$((pairs / ranks)) $lora"
  [dpo-full]="--set data.path=$work/pairs --set train.objective=dpo --set train.global_batch_size=$pairs --set train.micro_batch_size=$((pairs / ranks))"
  [simpo-lora]="--set data.path=$work/pairs --set train.objective=simpo --set train.global_batch_size=$pairs --set train.micro_batch_size=$((pairs / ranks)) $lora"
)
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq "$rounds"); do
  for mode in sft dpo-lora dpo-full simpo-lora; do
    # shellcheck disable=SC2086  # the mode's words
    out=$(mpirun -np "$ranks" "$trainer" "${common[@]}" ${modes[$mode]} 2>&1) || {
      echo "$out" | tail -20; exit 1; }
    done_line=$(grep -E "done: [0-9]+ steps" <<<"$out")
    rate=$(sed -E 's/.* ([0-9.]+) samples\/s.*/\1/' <<<"$done_line")
    batch=$pairs; [ "$mode" = sft ] && batch=$((2 * pairs))
    # Rank 0's row of the last memory table: rank tensors peak reserved rss "peak rss" ...
    peak_rss=$(grep -E "^ +0 " <<<"$out" | tail -1 | awk '{ print $6 }')
    awk -v r="$round" -v m="$mode" -v rate="$rate" -v b="$batch" -v rss="$peak_rss" \
      'BEGIN { printf "round %s %-10s %7.1f ms/step (%s samples/s, %d a step)  peak RSS rank 0 %s MiB\n", r, m, 1000 * b / rate, rate, b, rss }'
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
