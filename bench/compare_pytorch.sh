#!/usr/bin/env bash
# The trainer against the same model in PyTorch DistributedDataParallel (bench/pytorch_peer.py,
# gloo on CPU), same global batch, same number of ranks and threads per rank, side by side in
# one run. Prints a markdown table: samples/s of each and the trainer's ratio (> 1: faster).
#
#   bench/compare_pytorch.sh [STEPS]       (after scripts/bootstrap.sh; default 60 steps)
#
# Rows: the quickstart MLP, gpt-tiny (configs/gpt-tiny.yaml), gpt-tiny with GPT-2's vocabulary
# of 50,257 (where the output layer and the loss are most of the step) and the LSTM forecaster
# (configs/sequence-lstm.yaml) at 1 and 2 ranks, in fp32 and bf16 (the trainer's
# train.precision, the peer's torch.autocast), or the precisions in $PRECISIONS; $MODELS picks
# rows (default: mlp gpt gpt-50k lstm). Each pair runs twice, alternating (trainer, peer, trainer, peer), and the
# table shows the better of the two runs of each, so a noisy neighbour hurts neither side alone.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
steps=${1:-60}
py="$TRAINER_VENV/bin/python"
trainer=${TRAINER:-$BUILD_DIR/trainer}
[ -x "$trainer" ] || { echo "no $trainer: run scripts/bootstrap.sh first" >&2; exit 2; }

# One trainer run: prints its samples/s (the "done:" line: steps after the first).
run_trainer() {  # ranks config overrides...
  local np=$1 config=$2; shift 2
  mpirun -np "$np" "$trainer" --config "$config" --set train.steps="$steps" \
    --set train.eval_every=0 --set train.eval_samples=1 --set log.every=1000000 \
    --set memory.check_every=0 "$@" 2>&1 |
    sed -n 's/.*done: .* \([0-9.]*\) samples\/s.*/\1/p'
}
run_peer() {  # ranks args...
  local np=$1; shift
  mpirun -np "$np" "$py" bench/pytorch_peer.py "$@" --steps "$steps" 2>&1 |
    sed -n 's/^peer: .* samples\/s \([0-9.]*\) .*/\1/p'
}
best() { printf '%s\n' "$@" | sort -g | tail -1; }

echo "| model | precision | ranks | global batch | trainer samples/s | PyTorch DDP (gloo) samples/s | trainer / PyTorch |"
echo "|---|---|---:|---:|---:|---:|---:|"
row() {  # name precision ranks batch trainer-args(;-separated) peer-args(;-separated)
  local name=$1 precision=$2 np=$3 batch=$4
  IFS=';' read -r -a targs <<<"$5;--set;train.precision=$precision"
  IFS=';' read -r -a pargs <<<"$6;--precision;$precision"
  local t1 p1 t2 p2
  t1=$(run_trainer "$np" "${targs[@]}" --set train.global_batch_size="$batch")
  p1=$(run_peer "$np" "${pargs[@]}" --global-batch "$batch")
  t2=$(run_trainer "$np" "${targs[@]}" --set train.global_batch_size="$batch")
  p2=$(run_peer "$np" "${pargs[@]}" --global-batch "$batch")
  local t p
  t=$(best "$t1" "$t2"); p=$(best "$p1" "$p2")
  awk -v n="$name" -v pr="$precision" -v np="$np" -v b="$batch" -v t="$t" -v p="$p" \
    'BEGIN { printf "| %s | %s | %d | %d | %.1f | %.1f | %.2f |\n", n, pr, np, b, t, p, (p > 0 ? t / p : 0) }'
}

mlp_t="configs/mlp.yaml;--set;train.micro_batch_size=1000000"
mlp_p="mlp;--inputs;64;--hidden-dim;512;--depth;3;--classes;16"
gpt_t="configs/gpt-tiny.yaml;--set;train.micro_batch_size=1000000"
gpt_p="gpt;--data;data/tokens-sample;--context;64;--vocab;256;--layers;2;--heads;4;--d-model;64"
lstm_t="configs/sequence-lstm.yaml;--set;train.micro_batch_size=1000000"
lstm_p="lstm;--data;data/timeseries-sample/series.csv;--features;temperature,humidity,load;--targets;load;--window;48;--horizon;1;--hidden;64;--lstm-layers;2"
gpt50k_t="$gpt_t;--set;data.vocab_size=50257"
gpt50k_p="${gpt_p/--vocab;256/--vocab;50257}"
models=" ${MODELS:-mlp gpt gpt-50k lstm} "
wanted() { [[ $models == *" $1 "* ]]; }
for precision in ${PRECISIONS:-fp32 bf16}; do
  if wanted mlp; then for np in 1 2; do row "mlp (quickstart)" "$precision" "$np" 512 "$mlp_t" "$mlp_p"; done; fi
  if wanted gpt; then for np in 1 2; do row gpt-tiny "$precision" "$np" 32 "$gpt_t" "$gpt_p"; done; fi
  if wanted gpt-50k; then
    for np in 1 2; do row "gpt-tiny, vocab 50257" "$precision" "$np" 32 "$gpt50k_t" "$gpt50k_p"; done
  fi
  if wanted lstm; then for np in 1 2; do row "lstm (sequence)" "$precision" "$np" 64 "$lstm_t" "$lstm_p"; done; fi
done
