#!/usr/bin/env bash
# The trainer against the same model in plain PyTorch (bench/pytorch_peer.py: one process
# without DDP, or DistributedDataParallel over gloo at 2 ranks), same global batch, same number
# of ranks and threads per rank, side by side in one run. Prints a markdown table: samples/s of each and the trainer's ratio (> 1: faster).
#
#   bench/compare_pytorch.sh [STEPS]       (after scripts/bootstrap.sh --dev; default 60 steps)
#
# Rows: the quickstart MLP, gpt-tiny (configs/gpt-tiny.yaml), gpt-tiny with GPT-2's vocabulary
# of 50,257 (where the output layer and the loss are most of the step), the 3.2M-parameter GPT
# of 4 blocks, 256 wide, 4 heads, context 128, global batch 16 (gpt-3m: bytes; gpt-3m-bpe: the
# same text in GPT-2's BPE, vocabulary 50,257, where tiktoken's GPT-2 ranks are cached) and the
# Llama of the same size (llama-3m: configs/llama-tiny.yaml, 4 blocks, 256 wide, 8 heads over 4
# kv heads, SwiGLU 688, rotary, context 128, global batch 16), and the
# LSTM forecaster (configs/sequence-lstm.yaml) at 1 and 2 ranks, in fp32 and bf16 (the
# trainer's train.precision, the peer's torch.autocast), or the precisions in $PRECISIONS;
# $MODELS picks rows (default: mlp gpt gpt-50k gpt-3m gpt-3m-bpe llama-3m lstm; $BPE_STEPS steps for
# gpt-3m-bpe, default STEPS). Each pair runs
# $REPEATS times (default 3), alternating (trainer, peer, trainer, peer, ...), so that a noisy
# neighbour hurts both sides alike; the table shows the median of each side, the ratio of the
# medians and the spread of the ratio over the pairs. Throughput is the "done:" line's (training
# steps after the first; evaluation and checkpoints apart) and the peer's equivalent.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
steps=${1:-60}
py="$TRAINER_VENV/bin/python"
trainer=${TRAINER:-$BUILD_DIR/trainer}
[ -x "$trainer" ] || { echo "no $trainer: run scripts/bootstrap.sh --dev first" >&2; exit 2; }

# One trainer run: prints its samples/s (the "done:" line: steps after the first).
run_trainer() {  # ranks config overrides...
  local np=$1 config=$2; shift 2
  mpirun -np "$np" "$trainer" --config "$config" --set train.steps="$steps" --set train.warmup_steps=$((steps / 4)) \
    --set train.eval_every=0 --set train.eval_samples=1 --set log.every=1000000 \
    --set memory.check_every=0 "$@" 2>&1 |
    sed -n 's/.*done: .* \([0-9.]*\) samples\/s.*/\1/p'
}
# The peer gets its fastest launch: alone, --bind-to none (Open MPI would bind it to one core for
# np <= 2, where its threads then share that core; torchrun binds nothing); with 2 ranks, one core
# each (gloo's threads and the ranks compete without it: 44 against 36 samples/s on gpt 3.2M).
# The trainer runs as users run it: it widens a binding narrower than its share itself.
run_peer() {  # ranks args...
  local np=$1; shift
  local bind=()
  [ "$np" = 1 ] && bind=(--bind-to none)
  # As the trainer's done: line, the steps after the first: 1 warm-up step, 1 round of the rest.
  mpirun -np "$np" "${bind[@]}" "$py" bench/pytorch_peer.py "$@" --warmup 1 --rounds 1 \
    --steps $((steps - 1)) 2>&1 |
    sed -n 's/^peer: .* samples\/s \([0-9.]*\) .*/\1/p'
}
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "| model | precision | ranks | global batch | trainer samples/s | PyTorch (DDP over gloo at 2) samples/s | trainer / PyTorch | spread (per pair) |"
echo "|---|---|---:|---:|---:|---:|---:|---|"
row() {  # name precision ranks batch trainer-args(;-separated) peer-args(;-separated)
  local name=$1 precision=$2 np=$3 batch=$4
  IFS=';' read -r -a targs <<<"$5;--set;train.precision=$precision"
  IFS=';' read -r -a pargs <<<"$6;--precision;$precision"
  local ts=() ps=() ratios=() t p
  for _ in $(seq "${REPEATS:-3}"); do
    t=$(run_trainer "$np" "${targs[@]}" --set train.global_batch_size="$batch")
    p=$(run_peer "$np" "${pargs[@]}" --global-batch "$batch")
    ts+=("${t:-0}"); ps+=("${p:-0}")
    ratios+=("$(awk -v t="${t:-0}" -v p="${p:-0}" 'BEGIN { print (p > 0 ? t / p : 0) }')")
  done
  t=$(median "${ts[@]}"); p=$(median "${ps[@]}")
  local lo hi
  lo=$(printf '%s\n' "${ratios[@]}" | sort -g | head -1); hi=$(printf '%s\n' "${ratios[@]}" | sort -g | tail -1)
  awk -v n="$name" -v pr="$precision" -v np="$np" -v b="$batch" -v t="$t" -v p="$p" -v lo="$lo" -v hi="$hi" \
    'BEGIN { printf "| %s | %s | %d | %d | %.1f | %.1f | %.2f | %.2f-%.2f |\n", n, pr, np, b, t, p, (p > 0 ? t / p : 0), lo, hi }'
}

mlp_t="configs/mlp.yaml;--set;train.micro_batch_size=1000000"
mlp_p="mlp;--inputs;64;--hidden-dim;512;--depth;3;--classes;16"
gpt_t="configs/gpt-tiny.yaml;--set;train.micro_batch_size=1000000"
gpt_p="gpt;--data;data/tokens-sample;--context;64;--vocab;256;--layers;2;--heads;4;--d-model;64"
lstm_t="configs/sequence-lstm.yaml;--set;train.micro_batch_size=1000000"
lstm_p="lstm;--data;data/timeseries-sample/series.csv;--features;temperature,humidity,load;--targets;load;--window;48;--horizon;1;--hidden;64;--lstm-layers;2"
gpt50k_t="$gpt_t;--set;data.vocab_size=50257"
gpt50k_p="${gpt_p/--vocab;256/--vocab;50257}"
gpt3m_t="$gpt_t;--set;model.num_layers=4;--set;model.d_model=256;--set;model.heads=4;--set;data.context=128"
gpt3m_p="gpt;--data;data/tokens-sample;--context;128;--vocab;256;--layers;4;--heads;4;--d-model;256"
llama_t="configs/llama-tiny.yaml;--set;train.micro_batch_size=1000000;--set;train.sample_every=0"
llama_p="llama;--data;data/tokens-sample;--context;128;--vocab;256;--layers;4;--heads;8;--kv-heads;4;--d-model;256;--intermediate;688"
models=" ${MODELS:-mlp gpt gpt-50k gpt-3m gpt-3m-bpe llama-3m lstm} "
wanted() { [[ $models == *" $1 "* ]]; }
# GPT-2 BPE tokens of the sample text (data/tokens-sample holds its bytes, one per uint16 token),
# written by scripts/tokenize_text.py when tiktoken's GPT-2 ranks are cached.
bpe=""
ranks="$TRAINER_CACHE/gpt2.tiktoken"
if wanted gpt-3m-bpe; then
  if [ -f "$ranks" ]; then
    bpe=$(mktemp -d)/gpt2-tokens
    trap 'rm -rf "$(dirname "$bpe")"' EXIT
    "$py" -c 'import sys, numpy as np
open(sys.argv[2], "wb").write(np.fromfile(sys.argv[1], dtype=np.uint16).astype(np.uint8).tobytes())' \
      data/tokens-sample/train_000000.bin "$bpe.txt"
    "$py" scripts/tokenize_text.py --encoding gpt2 --ranks "$ranks" "$bpe.txt" "$bpe" >/dev/null
  else
    echo "gpt-3m-bpe rows skipped: no $ranks (scripts/bootstrap.sh --dev caches it)" >&2
  fi
fi
gpt3m_bpe_p="gpt;--data;$bpe;--context;128;--vocab;50257;--layers;4;--heads;4;--d-model;256"
for precision in ${PRECISIONS:-fp32 bf16}; do
  if wanted mlp; then for np in 1 2; do row "mlp (quickstart)" "$precision" "$np" 512 "$mlp_t" "$mlp_p"; done; fi
  if wanted gpt; then for np in 1 2; do row gpt-tiny "$precision" "$np" 32 "$gpt_t" "$gpt_p"; done; fi
  if wanted gpt-50k; then
    for np in 1 2; do row "gpt-tiny, vocab 50257" "$precision" "$np" 32 "$gpt50k_t" "$gpt50k_p"; done
  fi
  if wanted gpt-3m; then for np in 1 2; do row "gpt 3.2M (4x256, ctx 128)" "$precision" "$np" 16 "$gpt3m_t" "$gpt3m_p"; done; fi
  if wanted gpt-3m-bpe && [ -n "$bpe" ]; then
    all_steps=$steps; steps=${BPE_STEPS:-$steps}  # its steps are 10x slower: $BPE_STEPS
    for np in 1 2; do
      row "gpt 3.2M, GPT-2 BPE (vocab 50257)" "$precision" "$np" 16 \
        "$gpt3m_t;--set;data.path=$bpe;--set;data.vocab_size=50257" "$gpt3m_bpe_p"
    done
    steps=$all_steps
  fi
  if wanted llama-3m; then
    for np in 1 2; do row "llama 3.0M (4x256, 8/4 heads, ctx 128)" "$precision" "$np" 16 "$llama_t" "$llama_p"; done
  fi
  if wanted lstm; then for np in 1 2; do row "lstm (sequence)" "$precision" "$np" 64 "$lstm_t" "$lstm_p"; done; fi
done
