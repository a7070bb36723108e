#!/usr/bin/env bash
# A language model on one GPU: the trainer against PyTorch (eager and torch.compile), same model,
# batch and precision, in one run. For the device machine (scripts/device-check.sh bench) or any
# GPU machine with the trainer built in $BUILD_DIR.
#
#   bench/gpu_lm.sh MODEL [STEPS] [MICRO]
#     MODEL gpt2:   GPT-2 124M, 1,024 positions (defaults: 30 steps of 16 sequences)
#     MODEL smollm: the llama at SmolLM-135M's shape, 2,048 positions (30 steps of 8 sequences)
#   PRECISIONS="bf16 fp32" (default bf16)   VARIANTS=1: the trainer's extra bf16 rows too
#   (ddp.reduce_dtype: bf16, model.checkpoint_activations, ddp.shard: gradients)
#   PROFILE=DIR: instead of the table, Kineto traces of steps 3-7 of the trainer (log.profile),
#   PyTorch eager and torch.compile (bf16) in DIR, and bench/profile_summary.py's comparison of
#   them: phases, operators, the GPU's busy and idle time, the kernels with the most time
#
# The tokens are random ids in a shard written to $TMPDIR: speed does not depend on the text.
# Prints a markdown table: tokens/s, MFU (6 x parameters x tokens/s + attention's 12 x layers x
# width x positions per token, against 989 TFLOP/s bf16 or 495 TF32 dense on an H100, llm.c's
# convention), and the trainer's ratio to each peer.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
model=${1:?usage: bench/gpu_lm.sh gpt2|smollm [STEPS] [MICRO]}
steps=${2:-30}
build=${BUILD_DIR:-build}
py=${PYTHON:-python3}
case $model in
  gpt2)
    micro=${3:-16} vocab=50257 context=1024 layers=12 width=768
    trainer_model=(--config configs/gpt2.yaml)
    peer_model=(gpt --layers 12 --heads 12 --d-model 768) ;;
  smollm)
    micro=${3:-8} vocab=49152 context=2048 layers=30 width=576
    trainer_model=(--config configs/llama-tiny.yaml --set model.preset=smollm-135m
      --set "data.vocab_size=$vocab" --set "data.context=$context" --set data.tokenizer=bytes)
    peer_model=(llama --layers 30 --heads 9 --kv-heads 3 --d-model 576 --intermediate 1536) ;;
  *) echo "bench/gpu_lm.sh: unknown model '$model' (gpt2, smollm)" >&2; exit 2 ;;
esac
shards=${TMPDIR:-/tmp}/random-shards-$vocab
mkdir -p "$shards"
[ -f "$shards/train_000000.bin" ] || "$py" -c "
import numpy as np
np.random.default_rng(0).integers(0, $vocab, size=20_000_000, dtype=np.uint16).tofile('$shards/train_000000.bin')"

tokens_of() { sed -n 's/.* \([0-9.]*\) tokens\/s.*/\1/p' | tail -1; }
params_of() { sed -n 's/.*model [a-z0-9]*: \([0-9]*\) parameters.*/\1/p' | head -1; }
log=${OUT:-/tmp}/$model-trainer.log
trainer_run() {  # precision extra-args...: prints tokens/s (nothing if the run failed)
  local precision=$1 run
  shift
  run=$(mpirun -np 1 "$build/trainer" "${trainer_model[@]}" --set data.path="$shards" \
    --set data.val_path= --set train.steps="$steps" --set train.global_batch_size="$micro" \
    --set train.micro_batch_size="$micro" --set train.precision="$precision" --set train.warmup_steps=5 \
    --set train.eval_samples=1 --set train.eval_every=0 --set train.sample_every=0 --set checkpoint.dir= \
    --set checkpoint.resume= --set log.every=10 --set memory.check_every=0 "$@" 2>&1)
  printf '=== trainer %s %s\n%s\n' "$precision" "$*" "$run" >>"$log"
  grep "done:" <<<"$run" | tokens_of
}
peer_run() {  # precision extra-args...
  local precision=$1; shift
  "$py" bench/pytorch_peer.py "${peer_model[@]}" --device cuda --data "$shards" --context $context \
    --vocab $vocab --global-batch "$micro" --steps "$steps" --precision "$precision" "$@" 2>&1 |
    tee -a "${OUT:-/tmp}/$model-peer.log" | grep "^peer:" | tokens_of
}
# MFU of $1 tokens/s at precision $2, for $params parameters.
mfu() {
  awk -v t="$1" -v p="$params" -v l=$layers -v w=$width -v c=$context -v prec="$2" 'BEGIN {
    peak = (prec == "fp32" ? 495e12 : 989e12)
    printf "%.1f%%", 100 * t * (6 * p + 12 * l * w * c) / peak }'
}
row() {  # name precision tokens/s
  awk -v n="$1" -v p="$2" -v t="$3" -v e="$e" -v c="$c" -v m="$(mfu "$3" "$2")" 'BEGIN {
    printf "| %s | %s | %.0f | %s | %s | %s |\n", n, p, t, m, (e > 0 ? sprintf("%.2f", t / e) : "-"),
      (c > 0 ? sprintf("%.2f", t / c) : "-") }'
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if [ -n "${PROFILE:-}" ]; then
  rm -rf "$PROFILE" && mkdir -p "$PROFILE"
  echo "trainer $(trainer_run bf16 --set log.profile="$PROFILE/trainer") tokens/s (profiled)"
  echo "eager $(peer_run bf16 --trace "$PROFILE/eager") tokens/s (profiled)"
  echo "compiled $(peer_run bf16 --compile --trace "$PROFILE/compiled") tokens/s (profiled)"
  "$py" bench/profile_summary.py trainer="$PROFILE/trainer/trace_rank0.json" \
    eager="$PROFILE/eager/trace_rank0.json" compiled="$PROFILE/compiled/trace_rank0.json"
  exit
fi
echo "$model, $micro x $context tokens per step, $steps steps (tokens/s over steps 2-$steps)"
echo "| run | precision | tokens/s | MFU | / PyTorch eager | / torch.compile |"
echo "|---|---|---:|---:|---:|---:|"
for precision in ${PRECISIONS:-bf16}; do
  t=$(trainer_run "$precision")
  params=$(params_of <"$log")
  g=$(trainer_run "$precision" --set train.cuda_graphs=true)
  e=$(peer_run "$precision")
  c=$(peer_run "$precision" --compile)
  row "trainer (eager LibTorch)" "$precision" "$t"
  row "trainer, train.cuda_graphs" "$precision" "$g"
  if [ "${VARIANTS:-0}" = 1 ] && [ "$precision" = bf16 ]; then
    row "trainer, ddp.reduce_dtype: bf16" bf16 "$(trainer_run bf16 --set ddp.reduce_dtype=bf16)"
    row "trainer, model.checkpoint_activations" bf16 "$(trainer_run bf16 --set model.checkpoint_activations=true)"
    row "trainer, ddp.shard: gradients" bf16 "$(trainer_run bf16 --set ddp.shard=gradients)"
  fi
  row "PyTorch eager" "$precision" "$e"
  row "PyTorch torch.compile" "$precision" "$c"
done
