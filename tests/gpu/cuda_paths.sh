#!/usr/bin/env bash
# Every CUDA path of the trainer run once, as a user runs it, at world size 1 over NCCL: short
# runs of the shipped configs on the GPU, each checked for its exit code and the log line that
# proves the path ran. For a GPU machine (scripts/device-check.sh tests); DEVICE=cpu runs the same
# cases on the CPU, which checks this script, not the CUDA paths.
#
#   tests/gpu/cuda_paths.sh BUILD_DIR [CASE...]
#
# Prints one line per case, PASS or FAIL with the reason; in $LOGS, CASE.log holds the commands
# and a failure with its command's output, CASE.out every command's output.
# Exit 1 if a case failed; 0 with "no CUDA device on this machine" where there is none (ctest's
# gpu tier reports that as skipped). $PYTHON (default python3) tokenizes the chat sample.
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
shift
device=${DEVICE:-cuda}
if [ "$device" = cuda ] && ! nvidia-smi -L >/dev/null 2>&1; then
  echo "no CUDA device on this machine"
  exit 0
fi
logs=${LOGS:-$(mktemp -d)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$logs"
failed=()
# The chat sample with its loss masks and document boundaries (chat.json names this tokenizer).
chat=$work/chat-shards
"${PYTHON:-python3}" "$src/scripts/tokenize_text.py" --chat \
  --tokenizer "$src/data/chat-sample/tokenizer/tokenizer.json" "$src/data/chat-sample/chat.jsonl" \
  "$chat" >"$logs/tokenize.log" 2>&1 || { echo "FAIL: tokenize_text.py: $(tail -1 "$logs/tokenize.log")"; exit 1; }

# The common keys of every run: few steps, no evaluation or samples unless a case asks.
common=(--set train.device="$device" --set train.warmup_steps=2 --set train.eval_every=0
  --set train.sample_every=0 --set log.every=10 --set ddp.timeout_s=60)
tokens=(--config "$src/configs/llama-tiny.yaml" --set data.path="$src/data/tokens-sample")
cnn=(--config "$src/configs/cnn-denoise.yaml" --set data.path="$src/data/images-sample")
sft=(--config "$src/configs/llama-sft.yaml" --set data.path="$chat"
  --set data.tokenizer="$src/data/chat-sample/tokenizer/tokenizer.json" --set checkpoint.dir=)

source "$src/tests/case_lib.sh"  # fail, run, expect_rc, expect_grep (as e2e.sh's cases)
# Runs the trainer; a non-zero exit fails the case with the trainer's own message ("trainer:
# error: ..."), not Open MPI's plugin noise (pmix's "dlopen error" lines on the GPU machines).
# Every command's output is kept in $logs/CASE.out.
trainer() {
  run mpirun -np 1 "$build/trainer" "$@"
  cat "$out" >>"$logs/$case_name.out"
  [ "$rc" = 0 ] || fail "exit code $rc: $(grep -E "[a-z_]+: error:|what\(\)|Error:" "$out" | grep -v dlopen | head -1)"
}
# The output has each pattern "$@" (extended regex).
expect() {
  local p
  for p in "$@"; do expect_grep "$p"; done
}
# The 'done:' line's last loss is below the first (training went somewhere; e2e.sh's loss_drops
# asks for half, which these short runs need not reach).
loss_falls() {
  local line
  line=$(grep -E "done: [0-9]+ steps, loss" "$out" | tail -1) || fail "no 'done:' line"
  awk -v l="$line" 'BEGIN { match(l, /loss [0-9.]+ -> [0-9.]+/); split(substr(l, RSTART + 5, RLENGTH - 5), v, " -> ")
    exit !(v[2] + 0 < v[1] + 0) }' || fail "loss did not fall: $line"
}
# The memory plan's estimate of the step's peak within 15% of the measured peak (the first
# "memory after step N" line). Before b8b02d0 the first probe's peak held the workspaces the
# first pass makes and keeps: llama-tiny's plan said +40% on an H200.
plan_close() {
  local line
  line=$(grep -E "memory after step [0-9]+: estimated peak" "$out" | head -1) ||
    fail "no 'memory after step' line"
  awk -v l="$line" 'BEGIN { match(l, /\([-+][0-9]+%\)/); p = substr(l, RSTART + 1, RLENGTH - 3) + 0
    exit !(p >= -15 && p <= 15) }' || fail "the memory plan is off: $line"
}

case_mlp() {
  trainer --config "$src/configs/mlp.yaml" "${common[@]}" --set train.steps=60
  loss_falls
}
# Grouped-query attention through SDPA (enable_gqa) under bf16, and samples generated on the GPU
# during training.
case_llama_bf16() {
  trainer "${tokens[@]}" "${common[@]}" --set train.steps=60 --set train.precision=bf16 \
    --set train.sample_every=30 --set train.sample_tokens=24 --set train.eval_every=60
  loss_falls
  plan_close
  expect "eval step 60" "sample at step 30"
}
case_llama_fp16() {
  trainer "${tokens[@]}" "${common[@]}" --set train.steps=40 --set train.precision=fp16
  loss_falls
}
case_llama_graphs() {
  trainer "${tokens[@]}" "${common[@]}" --set train.steps=40 --set train.precision=bf16 \
    --set train.cuda_graphs=true
  loss_falls
  expect "train.cuda_graphs: captured"
}
case_muon() {
  trainer "${tokens[@]}" "${common[@]}" --set train.steps=40 --set train.precision=bf16 \
    --set train.optimizer=muon
  loss_falls
}
# ZeRO-3 (the gathers on their own streams, reduce-scatter), the async checkpoint's copy to host,
# then a resume under another mode (the moment blocks read onto the GPU) and --generate from it.
case_zero3_checkpoint_resume() {
  local ck=$work/zero3
  trainer "${tokens[@]}" "${common[@]}" --set train.steps=20 --set ddp.shard=parameters \
    --set checkpoint.dir="$ck" --set checkpoint.every=10
  expect "checkpoint written: .*step_000020"
  trainer "${tokens[@]}" "${common[@]}" --set train.steps=30 --set ddp.shard=none \
    --set checkpoint.dir="$ck" --set checkpoint.resume=auto
  expect "resumed from .*continuing at step 21" "done: 30 steps"
  trainer "${tokens[@]}" --set train.device="$device" --set checkpoint.dir="$ck" --generate "The "
  expect "new tokens after the prompt"
}
# An out-of-memory error injected in the backward pass of step 5 under each sharded mode: the
# fallback rung is taken on every rank and training goes on.
oom_in() {
  trainer "${tokens[@]}" "${common[@]}" --set train.steps=12 --set ddp.shard="$1" \
    --set memory.inject_oom=0:5:backward
  expect "done: 12 steps" "[1-9][0-9]* memory fallback"
}
case_oom_optimizer() { oom_in optimizer; }
case_oom_gradients() { oom_in gradients; }
case_oom_parameters() { oom_in parameters; }
# Packed conversations (the variable-length attention kernel on CUDA) under bf16, then a chat
# reply through the Hugging Face tokenizer on the GPU.
case_sft_packed() {
  local ck=$work/sft
  trainer "${sft[@]}" "${common[@]}" --set train.steps=40 --set train.precision=bf16 \
    --set checkpoint.dir="$ck"
  loss_falls
  trainer "${sft[@]}" --set train.device="$device" --set checkpoint.dir="$ck" \
    --generate --chat "What does data.packing do?"
  expect "new tokens after the prompt"
}
# LoRA adapters under bf16 with the frozen base sharded (ZeRO-3), exported as PEFT adapters.
case_lora_bf16() {
  local ck=$work/lora
  trainer "${sft[@]}" "${common[@]}" --set train.steps=30 --set train.precision=bf16 \
    --set model.lora_rank=8 --set ddp.shard=parameters --set checkpoint.dir="$ck"
  loss_falls
  trainer "${sft[@]}" --set model.lora_rank=8 --set checkpoint.dir="$ck" --export-peft "$work/peft"
  [ -f "$work/peft/adapter_model.safetensors" ] || fail "--export-peft wrote no adapter_model.safetensors"
}
# LoRA adapters captured in a CUDA graph with the frozen base (fp16's loss scale on the way).
case_lora_graphs() {
  trainer "${tokens[@]}" "${common[@]}" --set train.steps=30 --set train.precision=fp16 \
    --set model.lora_rank=8 --set train.cuda_graphs=true
  loss_falls
  expect "train.cuda_graphs: captured"
}
# The CNN's channels-last tensors through a checkpoint and a resume on the GPU.
case_cnn_checkpoint() {
  local ck=$work/cnn
  trainer "${cnn[@]}" "${common[@]}" --set train.steps=10 --set checkpoint.dir="$ck" \
    --set checkpoint.every=5
  expect "checkpoint written"
  trainer "${cnn[@]}" "${common[@]}" --set train.steps=15 --set checkpoint.dir="$ck" \
    --set checkpoint.resume=auto
  expect "continuing at step 11" "done: 15 steps"
}

all=(mlp llama_bf16 llama_fp16 llama_graphs muon zero3_checkpoint_resume oom_optimizer
  oom_gradients oom_parameters sft_packed lora_bf16 lora_graphs cnn_checkpoint)
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=("${all[@]}")
for c in "${cases[@]}"; do
  start=$SECONDS
  : >"$logs/$c.out"
  # case_lib's fail() exits the case's subshell with "FAIL [case]: reason" and the command's output.
  if (case_name=$c && cd "$work" && "case_$c") >"$logs/$c.log" 2>&1; then
    echo "PASS $c ($((SECONDS - start)) s)"
  else
    reason=$(sed -n "s/^FAIL \[$c\]: //p" "$logs/$c.log" | head -1)
    echo "FAIL $c ($((SECONDS - start)) s): ${reason:-see $logs/$c.log}"
    failed+=("$c")
  fi
done
[ ${#failed[@]} -eq 0 ] || { echo "failed: ${failed[*]}"; exit 1; }
