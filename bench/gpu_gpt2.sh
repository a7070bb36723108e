#!/usr/bin/env bash
# GPT-2 124M on one GPU, sequence length 1024: the trainer against PyTorch (eager and
# torch.compile), same batch, same precision, in one run; the trainer eager and with
# train.cuda_graphs (the goals: 1.10x PyTorch eager, 0.95x compiled, MFU 50%). For the device
# machine (run by scripts/device-check.sh bench) or any GPU machine with the trainer built in $BUILD_DIR.
#
#   bench/gpu_gpt2.sh [STEPS] [MICRO]        (defaults: 40 steps of 16 sequences)
#
# The tokens are random ids below 50257 in a shard written to $TMPDIR: speed does not depend on
# the text. Prints a markdown table of tokens/s and the trainer's ratio to each peer.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
steps=${1:-40}
micro=${2:-16}
build=${BUILD_DIR:-build}
py=${PYTHON:-python3}
shards=${TMPDIR:-/tmp}/gpt2-random-shards
mkdir -p "$shards"
[ -f "$shards/train_000000.bin" ] || "$py" -c "
import numpy as np
np.random.default_rng(0).integers(0, 50257, size=20_000_000, dtype=np.uint16).tofile('$shards/train_000000.bin')"

tokens_of() { sed -n 's/.* \([0-9.]*\) tokens\/s.*/\1/p' | tail -1; }
trainer_run() {  # precision extra-args...
  local precision=$1; shift
  mpirun -np 1 "$build/trainer" --config configs/gpt2.yaml --set data.path="$shards" \
    --set data.val_path= --set train.steps="$steps" --set train.global_batch_size="$micro" \
    --set train.micro_batch_size="$micro" --set train.precision="$precision" --set train.warmup_steps=5 \
    --set train.eval_samples=1 --set train.eval_every=0 --set checkpoint.dir= \
    --set checkpoint.resume= --set log.every=10 --set memory.check_every=0 "$@" 2>&1 |
    tee -a "${OUT:-/tmp}/gpt2-trainer.log" | grep "done:"
}
peer_run() {  # precision extra-args...
  local precision=$1; shift
  "$py" bench/pytorch_peer.py gpt --device cuda --data "$shards" --context 1024 --vocab 50257 \
    --layers 12 --heads 12 --d-model 768 --global-batch "$micro" --steps "$steps" \
    --precision "$precision" "$@" 2>&1 | tee -a "${OUT:-/tmp}/gpt2-peer.log" | grep "^peer:"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "| run | precision | tokens/s | this / PyTorch |"
echo "|---|---|---:|---:|"
# Each trainer row against each peer: the ratio column is trainer / peer for that trainer row.
for precision in bf16 fp32; do
  t=$(trainer_run "$precision" | tokens_of)
  g=$(trainer_run "$precision" --set train.cuda_graphs=true | tokens_of)
  e=$(peer_run "$precision" | tokens_of)
  c=$(peer_run "$precision" --compile | tokens_of)
  awk -v p="$precision" -v t="$t" -v g="$g" -v e="$e" -v c="$c" 'BEGIN {
    printf "| trainer (eager LibTorch) | %s | %.0f | eager %.2f, compiled %.2f |\n", p, t,
      (e > 0 ? t / e : 0), (c > 0 ? t / c : 0)
    printf "| trainer, train.cuda_graphs | %s | %.0f | eager %.2f, compiled %.2f |\n", p, g,
      (e > 0 ? g / e : 0), (c > 0 ? g / c : 0)
    printf "| PyTorch eager | %s | %.0f | |\n", p, e
    printf "| PyTorch torch.compile | %s | %.0f | |\n", p, c }'
done
