#!/usr/bin/env bash
# A language model on one GPU: the trainer against PyTorch (eager and torch.compile), same model,
# batch and precision, in one run. For the device machine (scripts/device-check.sh bench) or any
# GPU machine with the trainer built in $BUILD_DIR.
#
#   bench/gpu_lm.sh MODEL [STEPS] [MICRO]
#     MODEL gpt2:   GPT-2 124M, 1,024 positions (defaults: 30 steps of 16 sequences)
#     MODEL smollm: the llama at SmolLM-135M's shape, 2,048 positions (30 steps of 8 sequences)
#     MODEL tiny:   configs/gpt-tiny.yaml (64 positions, 32 sequences): a smoke test of this
#                   script, on a CPU too with DEVICE=cpu (no graphs row there)
#     STEPS: timed steps per round, after WARMUP (10) untimed steps; ROUNDS (3) rounds per row,
#     the row shows their median: the peer's rounds in one process (bench/pytorch_peer.py
#     --rounds), the trainer's as ROUNDS runs of WARMUP + STEPS steps, each measured from its
#     step lines after step WARMUP (log.every: WARMUP)
#   PRECISIONS="bf16 fp32" (default bf16)   VARIANTS=1: the trainer's extra bf16 rows too, one run
#   each (ddp.reduce_dtype: bf16, model.checkpoint_activations, ddp.shard: gradients)
#   PROFILE=DIR: instead of the table, Kineto traces of 5 steps after the warm-up of the trainer
#   (log.profile), PyTorch eager and torch.compile (bf16) in DIR, and bench/profile_summary.py's
#   comparison of them: phases, operators, the GPU's busy and idle time, the kernels with the most
#   time
#
# The peer is the best a PyTorch user gets (bench/pytorch_peer.py): no DDP wrapper at one
# process, no host synchronisation in the step, the warm-up (and torch.compile's compilation)
# untimed, the vocabulary padded as the trainer's, fused AdamW and clipping at 1.0 with the
# config's AdamW settings; the lines under the table say how each peer ran.
# The tokens are random ids in a shard written to $TMPDIR: speed does not depend on the text.
# Prints a markdown table: tokens/s, MFU (6 x parameters x tokens/s + attention's 12 x layers x
# width x positions per token, against 989 TFLOP/s bf16 or 495 TF32 dense on an H100, llm.c's
# convention), and the trainer's ratio to each peer.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
usage="usage: bench/gpu_lm.sh gpt2|smollm|tiny [STEPS] [MICRO] (WARMUP, ROUNDS, PRECISIONS, VARIANTS, PROFILE, DEVICE)"
model=${1:?$usage}
device=${DEVICE:-cuda}
steps=${2:-30}
warmup=${WARMUP:-10}
rounds=${ROUNDS:-3}
build=${BUILD_DIR:-build}
py=${PYTHON:-python3}
# The peer's AdamW and clipping are the trainer config's (train.lr, weight_decay, beta2, grad_clip).
case $model in
  gpt2)
    micro=${3:-16} vocab=50257 context=1024 layers=12 width=768
    trainer_model=(--config configs/gpt2.yaml)
    peer_model=(gpt --layers 12 --heads 12 --d-model 768 --lr 6e-4 --weight-decay 0.1 --beta2 0.95 --clip 1.0) ;;
  smollm)
    micro=${3:-8} vocab=49152 context=2048 layers=30 width=576
    trainer_model=(--config configs/llama-tiny.yaml --set model.preset=smollm-135m
      --set "data.vocab_size=$vocab" --set "data.context=$context" --set data.tokenizer=bytes)
    peer_model=(llama --layers 30 --heads 9 --kv-heads 3 --d-model 576 --intermediate 1536
      --lr 2e-3 --weight-decay 0.1 --beta2 0.95 --clip 1.0) ;;
  tiny)
    micro=${3:-32} vocab=256 context=64 layers=2 width=64
    trainer_model=(--config configs/gpt-tiny.yaml)
    peer_model=(gpt --layers 2 --heads 4 --d-model 64 --lr 3e-3 --weight-decay 0.1 --beta2 0.95 --clip 1.0) ;;
  *) echo "bench/gpu_lm.sh: unknown model '$model' (gpt2, smollm, tiny)" >&2; exit 2 ;;
esac
for n in "steps=$steps" "micro=$micro" "WARMUP=$warmup" "ROUNDS=$rounds"; do
  [[ ${n#*=} =~ ^[1-9][0-9]*$ ]] || { echo "bench/gpu_lm.sh: $n is not a positive integer; $usage" >&2; exit 2; }
done
case $device in cuda | cpu) ;; *) echo "bench/gpu_lm.sh: DEVICE=$device is not cuda or cpu" >&2; exit 2 ;; esac
if [ -n "${PROFILE:-}" ] && [ "$steps" -lt 5 ]; then
  echo "bench/gpu_lm.sh: PROFILE traces 5 steps after the warm-up: STEPS $steps is fewer" >&2; exit 2
fi
shards=${TMPDIR:-/tmp}/random-shards-$vocab
mkdir -p "$shards"
[ -f "$shards/train_000000.bin" ] || "$py" -c "
import numpy as np
np.random.default_rng(0).integers(0, $vocab, size=20_000_000, dtype=np.uint16).tofile('$shards/train_000000.bin')"

params_of() { sed -n 's/.*model [a-z0-9]*: \([0-9]*\) parameters.*/\1/p' | head -1; }
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
log=${OUT:-/tmp}/$model-trainer.log
# tokens/s of a trainer log's steps after the warm-up: its step lines' windows (log.every steps,
# each "N samples/s"), the tokens over the time.
after_warmup() {
  sed -n 's/.* step *\([0-9]*\)\/[0-9]* .* \([0-9.]*\) samples\/s.*/\1 \2/p' |
    awk -v w="$warmup" -v c="$context" '$1 > w && prev >= w && $2 > 0 { n += $1 - prev; t += ($1 - prev) / $2 }
      { prev = $1 } END { if (t > 0) printf "%.0f\n", c * n / t }'
}
trainer_once() {  # precision extra-args...: prints tokens/s (nothing if the run failed)
  local precision=$1 run
  shift
  run=$(mpirun -np 1 "$build/trainer" "${trainer_model[@]}" --set train.device="$device" --set data.path="$shards" \
    --set data.val_path= --set train.steps=$((warmup + steps)) --set train.global_batch_size="$micro" \
    --set train.micro_batch_size="$micro" --set train.precision="$precision" --set train.warmup_steps=5 \
    --set train.eval_samples=1 --set train.eval_every=0 --set train.sample_every=0 --set checkpoint.dir= \
    --set checkpoint.resume= --set log.every="$warmup" --set memory.check_every=0 "$@" 2>&1)
  printf '=== trainer %s %s\n%s\n' "$precision" "$*" "$run" >>"$log"
  after_warmup <<<"$run"
}
# "MEDIAN ROUND1 ROUND2 ...", or "0" if no run measured anything.
trainer_run() {  # runs precision extra-args...
  local n=$1 all=() t
  shift
  for _ in $(seq "$n"); do
    t=$(trainer_once "$@")
    [ -n "$t" ] && all+=("$t")
  done
  [ ${#all[@]} -gt 0 ] || { echo 0; return; }
  echo "$(median "${all[@]}") ${all[*]}"
}
peer_log=${OUT:-/tmp}/$model-peer.log
# "MEDIAN ROUND1 ROUND2 ..." in tokens/s, or "0"; the peer's peer-setup line goes to $peer_log.
peer_run() {  # precision extra-args...
  local precision=$1 run
  shift
  run=$("$py" bench/pytorch_peer.py "${peer_model[@]}" --device "$device" --data "$shards" --context $context \
    --vocab $vocab --global-batch "$micro" --warmup "$warmup" --rounds "$rounds" --steps "$steps" \
    --precision "$precision" "$@" 2>&1)
  printf '=== peer %s %s\n%s\n' "$precision" "$*" "$run" >>"$peer_log"
  sed -n 's/^peer: .* samples\/s [0-9.]* \([0-9]*\) tokens\/s .* rounds \(.*\)/\1 \2/p' <<<"$run" |
    awk -v c="$context" '{ printf "%s", $1; for (i = 2; i <= NF; i++) printf " %.0f", $i * c; print "" }' |
    grep . || echo 0
}
setup_of() { grep "^peer-setup: $1" "$peer_log" | tail -1 | sed 's/^peer-setup: //'; }
# MFU of $1 tokens/s at precision $2, for $params parameters.
mfu() {
  awk -v t="$1" -v p="$params" -v l=$layers -v w=$width -v c=$context -v prec="$2" 'BEGIN {
    peak = (prec == "fp32" ? 495e12 : 989e12)
    printf "%.1f%%", 100 * t * (6 * p + 12 * l * w * c) / peak }'
}
row() {  # name precision "MEDIAN ROUNDS..."
  local t=${3%% *} each=
  [ "$t" = "$3" ] || each=${3#* }
  awk -v n="$1" -v p="$2" -v t="$t" -v e="${e%% *}" -v c="${c%% *}" -v m="$(mfu "$t" "$2")" -v r="$each" 'BEGIN {
    gsub(/ /, ", ", r)
    printf "| %s | %s | %.0f | %s | %s | %s | %s |\n", n, p, t, m, (e > 0 ? sprintf("%.2f", t / e) : "-"),
      (c > 0 ? sprintf("%.2f", t / c) : "-"), r }'
}

[ "$device" = cpu ] || nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if [ -n "${PROFILE:-}" ]; then
  rm -rf "$PROFILE" && mkdir -p "$PROFILE"
  # The trainer's trace: the first 5 steps after the warm-up, as the peer's.
  t=$(trainer_run 1 bf16 --set log.profile="$PROFILE/trainer" --set log.profile_from=$((warmup + 1)))
  echo "trainer ${t%% *} tokens/s (the 5 profiled steps among the timed ones)"
  rounds=1
  e=$(peer_run bf16 --trace "$PROFILE/eager")
  echo "eager ${e%% *} tokens/s (1 round, after the 5 profiled steps)"
  c=$(peer_run bf16 --compile --trace "$PROFILE/compiled")
  echo "compiled ${c%% *} tokens/s (1 round, after the 5 profiled steps)"
  "$py" bench/profile_summary.py trainer="$PROFILE/trainer/trace_rank0.json" \
    eager="$PROFILE/eager/trace_rank0.json" compiled="$PROFILE/compiled/trace_rank0.json"
  exit
fi
echo "$model, $micro x $context tokens per step; each row the median of $rounds rounds of $steps timed steps after $warmup untimed warm-up steps"
echo "| run | precision | tokens/s | MFU | / PyTorch eager | / torch.compile | rounds (tokens/s) |"
echo "|---|---|---:|---:|---:|---:|---|"
for precision in ${PRECISIONS:-bf16}; do
  t=$(trainer_run "$rounds" "$precision")
  params=$(params_of <"$log")
  g=0
  [ "$device" = cpu ] || g=$(trainer_run "$rounds" "$precision" --set train.cuda_graphs=true)
  e=$(peer_run "$precision")
  c=$(peer_run "$precision" --compile)
  row "trainer (eager LibTorch)" "$precision" "$t"
  [ "$device" = cpu ] || row "trainer, train.cuda_graphs" "$precision" "$g"
  if [ "${VARIANTS:-0}" = 1 ] && [ "$precision" = bf16 ]; then
    row "trainer, ddp.reduce_dtype: bf16 (1 run)" bf16 "$(trainer_run 1 bf16 --set ddp.reduce_dtype=bf16)"
    row "trainer, model.checkpoint_activations (1 run)" bf16 "$(trainer_run 1 bf16 --set model.checkpoint_activations=true)"
    row "trainer, ddp.shard: gradients (1 run)" bf16 "$(trainer_run 1 bf16 --set ddp.shard=gradients)"
  fi
  row "PyTorch eager" "$precision" "$e"
  row "PyTorch torch.compile" "$precision" "$c"
done
echo "- trainer: $rounds runs of $((warmup + steps)) steps (log.every $warmup), tokens/s over steps $((warmup + 1))-$((warmup + steps)) of each"
echo "- PyTorch eager: $(setup_of eager)"
echo "- PyTorch torch.compile: $(setup_of torch.compile)"
