#!/usr/bin/env bash
# End-to-end checks of the language-model features as a user runs them: model.init_from with a
# Hugging Face GPT-2 (fine-tuning under mpirun), --export-hf, --generate, train.sample_every, and
# their errors; the same for a Hugging Face Llama and configs/llama-tiny.yaml, and supervised
# fine-tuning on conversations (configs/llama-sft.yaml, --generate --chat; on Qwen3 with ChatML
# too). The Hugging Face
# side is `transformers` (tests/hf/hf_gpt2.py, hf_llama.py, offline, random models).
#   language_models.sh CASE TRAINER SOURCE_DIR
set -uo pipefail
case_name=$1 trainer=$2 src=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$src/tests/case_lib.sh"
py() { "$TRAINER_PYTHON" "$src/tests/hf/hf_gpt2.py" "$@"; }
pyllama() { "$TRAINER_PYTHON" "$src/tests/hf/hf_llama.py" "$@"; }
pytasks() { "$TRAINER_PYTHON" "$src/tests/hf/hf_tasks.py" "$@"; }

# A byte-level BPE tokenizer.json (tests/unit/bpe_reference.py: 1093 ids, offline) and token shards
# of a text in it, and the tiny gpt's settings for them (16 positions of data, 32 of model): for
# eval.tasks and bits per byte.
eval_setup() {
  "$TRAINER_PYTHON" "$src/tests/unit/bpe_reference.py" "$work/tok" >/dev/null || fail "bpe_reference.py"
  tok=$work/tok/gpt2-pattern/tokenizer.json
  mkdir -p "$work/shards" "$work/tasks"
  vocab=$(pytasks shards "$work/shards" "$tok") || fail "hf_tasks.py shards: $vocab"
  evalrun=(--config "$src/configs/gpt-tiny.yaml" --set data.path="$work/shards" --set train.device=cpu
    --set data.vocab_size="$vocab" --set data.tokenizer="$tok" --set data.context=16
    --set model.context=32 --set train.global_batch_size=8 --set train.warmup_steps=0)
}

# The first and last loss of the 'done:' line.
losses() {
  local line
  line=$(grep -E "done: [0-9]+ steps, loss" "$out" | tail -1) || fail "no 'done:' line"
  first=$(sed -E 's/.*loss ([0-9.]+) -> ([0-9.]+).*/\1/' <<<"$line")
  last=$(sed -E 's/.*loss ([0-9.]+) -> ([0-9.]+).*/\2/' <<<"$line")
}

# Step 1's loss (the 'done:' line's first) equals REFERENCE within 1e-3 relative, and the last is
# below 0.7 of the first; prints both. (The global batch is every window of the shard, so step 1's
# loss is the reference model's mean loss over the shard.)
expect_imported_then_falls() {
  local ref=$1
  losses
  awk -v a="$first" -v b="$ref" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 1e-3 * b) }' \
    || fail "step 1 loss $first, the Hugging Face model's mean loss over the shard is $ref"
  awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < 0.7 * f) }' || fail "loss did not fall: $first -> $last"
  echo "step 1 loss $first = transformers' $ref; then $last"
}

tiny=(--config "$src/configs/gpt-tiny.yaml" --set data.path="$src/data/tokens-sample"
  --set train.device=cpu --set log.every=5 --set train.warmup_steps=0)
llama=(--config "$src/configs/llama-tiny.yaml" --set data.path="$src/data/tokens-sample"
  --set train.device=cpu --set log.every=5 --set train.warmup_steps=0 --set data.context=32)

# One case per label, each on a line of its own as "  name)": tests/CMakeLists.txt reads the ctest
# list from these labels (trainer_script_cases).
case $case_name in
  hf_finetune_np2)
    # configs/gpt2.yaml from a (small, random) Hugging Face GPT-2 with GPT-2's vocabulary, on
    # uint16 shards of GPT-2 ids. The global batch is every window of the shard, so step 1's loss
    # is the Hugging Face model's mean loss over the shard, whatever the order: the weights
    # arrived. Then the loss falls.
    py make "$work/hf" --vocab 50257 --layers 2 --heads 4 --width 64 --positions 64 --seed 1 >/dev/null 2>&1 \
      || fail "could not make the transformers model"
    mkdir -p "$work/shards"
    py shard "$work/shards/train_000000.bin" $((16 * 32 + 1)) 50257
    py shard "$work/shards/val_000000.bin" $((4 * 32 + 1)) 50257 --seed 1
    expected=$(py loss "$work/hf" "$work/shards/train_000000.bin" 32) || fail "reference loss: $expected"
    run mpirun -np 2 "$trainer" --config "$src/configs/gpt2.yaml" --set model.init_from="$work/hf" \
      --set data.path="$work/shards" --set data.context=32 --set model.context=64 --set train.device=cpu \
      --set ddp.backend=auto --set train.global_batch_size=16 --set train.steps=30 \
      --set train.warmup_steps=2 --set train.lr=0.003 --set train.eval_every=30 \
      --set checkpoint.dir="$work/ckpt" --set log.every=10
    expect_rc 0
    expect_grep "model.init_from: weights of Hugging Face GPT-2 $work/hf/model.safetensors \(2 blocks, 4 heads, 64 wide, 64 positions\)"
    expect_imported_then_falls "${expected%% *}"
    # Resuming ignores init_from, saying so.
    run mpirun -np 2 "$trainer" --config "$src/configs/gpt2.yaml" --set model.init_from="$work/hf" \
      --set data.path="$work/shards" --set data.context=32 --set model.context=64 --set train.device=cpu \
      --set ddp.backend=auto --set train.global_batch_size=16 --set train.steps=32 --set train.warmup_steps=2 \
      --set checkpoint.dir="$work/ckpt" --set log.every=1
    expect_rc 0; expect_grep "model.init_from ignored: resuming from $work/ckpt/final.safetensors"
    expect_grep "step +31/32" ;;
  zero3_hf_llama_np8)
    # Issue 39's whole path on 8 oversubscribed CPU ranks: a random Hugging Face Llama in bf16
    # shards (32 blocks, 10.1M parameters: 38.5 MiB in fp32) is fine-tuned under ddp.shard:
    # parameters from model.init_from with memory.cpu_budget_mb = 30, below its whole fp32 weights
    # (each rank reads only its blocks of the files, holds its 16/8 bytes per parameter, two
    # units, one unit's gradients and the activations); under gradients the plan refuses the same
    # run before building the model whole (exit 2), naming parameters. It checkpoints
    # sharded, resumes on 2 ranks (their share is 8 bytes per parameter: the default budget), is
    # exported with --export-hf and consolidated with --consolidate (both streamed), and
    # transformers gives the exported model the logits it gives the consolidated checkpoint's
    # parameters, within 1e-4. The checkpoint's host copy is in the plan (Note [A bounded shard
    # write]): with it the step's peak would pass the budget (the copy is 12/8 bytes per
    # parameter), so the run says so and writes each checkpoint before training goes on, one
    # tensor at a time, without a copy.
    pyllama make "$work/hf" --vocab 256 --layers 32 --heads 4 --kv-heads 2 --width 128 \
      --intermediate 688 --positions 64 --untied --max-shard-size 8MB --dtype bf16 --seed 3 \
      >/dev/null 2>&1 || fail "could not make the transformers model"
    ls "$work/hf"/model-0000*-of-0000*.safetensors >/dev/null || fail "not in shards: $(ls "$work/hf")"
    z3=(--config "$src/configs/llama-tiny.yaml" --set data.path="$src/data/tokens-sample"
      --set train.device=cpu --set model.init_from="$work/hf" --set data.context=32
      --set train.global_batch_size=8 --set train.micro_batch_size=1 --set train.warmup_steps=1
      --set train.eval_every=0 --set log.every=1 --set checkpoint.dir="$work/ckpt"
      --set checkpoint.every=2 --set ddp.timeout_s=300 --set model.checkpoint_activations=true)
    run timeout 300 mpirun -np 8 "$trainer" "${z3[@]}" --set train.steps=4 \
      --set memory.cpu_budget_mb=30 --set ddp.shard=gradients
    expect_rc 2
    expect_grep "model llama \\([0-9.]+ MiB of parameters and buffers\\) cannot be built whole on every rank under ddp.shard: gradients"
    expect_grep "set ddp.shard: parameters \\(--set ddp.shard=parameters\\)"
    expect_no_grep "step +1/"
    run timeout 900 mpirun -np 8 "$trainer" "${z3[@]}" --set train.steps=4 \
      --set memory.cpu_budget_mb=30 --set ddp.shard=parameters
    expect_rc 0; expect_grep "8 rank\(s\)"
    expect_grep "memory plan \(rank 0, ddp.shard: parameters\)"
    expect_grep "checkpoint.async: with the host copy of this rank's shard \([0-9.]+ MiB\) the step's peak would be"
    expect_grep "done: 4 steps, .* 0 memory fallback\(s\)"
    [ -f "$work/ckpt/final/manifest.json" ] || fail "no sharded final checkpoint: $(ls "$work/ckpt")"
    run timeout 600 mpirun -np 2 "$trainer" "${z3[@]}" --set train.steps=6 --set ddp.shard=parameters \
      --set checkpoint.resume=auto
    expect_rc 0; expect_grep "step +5/6"; expect_grep "done: 6 steps"
    run timeout 300 "$trainer" "${z3[@]}" --set train.steps=6 --export-hf "$work/exported"
    expect_rc 0; expect_grep "from checkpoint $work/ckpt/[a-z_0-9]+ \(6 steps done\)"
    chosen=$(grep -oE "from checkpoint $work/ckpt/[a-z_0-9]+" "$out" | head -1 | sed 's/from checkpoint //')
    run timeout 300 "$trainer" "${z3[@]}" --consolidate "$chosen"
    expect_rc 0
    pyllama checkpoint-logits "$chosen.safetensors" "$work/exported" \
      "$work/hf/expected.safetensors" "$work/from_checkpoint.safetensors" || fail "checkpoint-logits"
    pyllama logits "$work/exported" "$work/hf/expected.safetensors" "$work/from_export.safetensors" \
      || fail "logits of the export"
    run pyllama close "$work/from_export.safetensors" "$work/from_checkpoint.safetensors" 1e-4
    expect_rc 0; cat "$out" ;;
  export_hf)
    # A trainer checkpoint exported with --export-hf loads with from_pretrained (no missing or
    # unexpected keys) and gives the logits of the checkpoint's parameters mapped independently
    # in Python. The padded vocabulary (vocab 300 -> 320 rows) is cut.
    py shard "$work/train_000000.bin" 4000 300
    run mpirun -np 2 "$trainer" "${tiny[@]}" --set data.path="$work/train_000000.bin" \
      --set data.vocab_size=300 --set data.tokenizer=bytes --set model.num_layers=3 \
      --set train.steps=10 --set checkpoint.dir="$work/ckpt"
    expect_rc 0
    run "$trainer" "${tiny[@]}" --set data.vocab_size=300 --set model.num_layers=3 \
      --set checkpoint.dir="$work/ckpt" --export-hf "$work/exported"
    expect_rc 0; expect_grep "wrote $work/exported/config.json and $work/exported/model.safetensors from checkpoint $work/ckpt/final.safetensors \(10 steps done\)"
    grep -q '"vocab_size": 300' "$work/exported/config.json" || fail "config.json: $(cat "$work/exported/config.json")"
    run py check-export "$work/exported" "$work/ckpt/final.safetensors"
    expect_rc 0; cat "$out"
    # The exported directory is a model.init_from too, with the same weights: the same loss.
    run "$trainer" "${tiny[@]}" --set data.path="$work/train_000000.bin" --set data.vocab_size=300 \
      --set model.init_from="$work/exported" --set train.steps=1 --set train.lr=1e-9
    expect_rc 0; losses; from_hf=$first
    run "$trainer" "${tiny[@]}" --set data.path="$work/train_000000.bin" --set data.vocab_size=300 \
      --set model.num_layers=3 --set model.init_from="$work/ckpt/final.safetensors" \
      --set train.steps=1 --set train.lr=1e-9
    expect_rc 0; expect_grep "weights of trainer checkpoint"; losses
    [ "$first" = "$from_hf" ] || fail "loss from the export $from_hf, from the checkpoint $first" ;;
  export_builtin_tokenizers)
    # --export-hf writes the built-in encodings as a tokenizer.json with which transformers'
    # tokenizer gives the trainer's ids: bytes, each byte its id; gpt2, tiktoken's ids and
    # <|endoftext|> as 50256 (scripts/tokenize_text.py's encoding). A bad --export-dtype exits 2
    # naming the flag, before anything is written.
    for enc in bytes:256 gpt2:50257; do
      name=${enc%%:*}
      cfg=("${tiny[@]}" --set data.tokenizer="$name" --set data.vocab_size="${enc#*:}"
        --set model.num_layers=1 --set checkpoint.dir="$work/$name")
      run "$trainer" "${cfg[@]}" --set train.steps=1 --set train.eval_every=0 --set train.sample_every=0
      expect_rc 0
      run "$trainer" "${cfg[@]}" --export-hf "$work/$name-hf" --export-dtype fp16
      expect_rc 0; expect_grep "dtype float16, and tokenizer.json, tokenizer_config.json, generation_config.json \(the tokenizer from data.tokenizer $name\)"
    done
    "$TRAINER_PYTHON" - "$work" "$src/scripts" <<'PY' || fail "the exported tokenizers differ from the trainer's"
import json, os, sys
os.environ["HF_HUB_OFFLINE"] = "1"
work, scripts = sys.argv[1:]
sys.path.insert(0, scripts)
from transformers import AutoTokenizer
import tokenize_text
texts = ["Hello, world!", "  naïve café 日本語 👍🏽\n\tx", "it's 2026's   end<|endoftext|>", ""]
byte_tok = AutoTokenizer.from_pretrained(f"{work}/bytes-hf")
for t in texts:
    assert byte_tok.encode(t, add_special_tokens=False) == list(t.encode()), t
    assert byte_tok.decode(list(t.encode())) == t, t
gpt2 = tokenize_text.gpt2_encoding(tokenize_text.default_ranks_path())
gpt2_tok = AutoTokenizer.from_pretrained(f"{work}/gpt2-hf")
with open(os.path.join(scripts, "..", "README.md"), encoding="utf-8") as f:
    texts.append(f.read())
for t in texts:
    ours = gpt2_tok.encode(t.replace("<|endoftext|>", ""), add_special_tokens=False)
    assert ours == gpt2.encode_ordinary(t.replace("<|endoftext|>", "")), t[:40]
assert gpt2_tok.encode("a<|endoftext|>", add_special_tokens=False)[-1] == 50256
assert gpt2_tok.eos_token == "<|endoftext|>"
for name in ("bytes", "gpt2"):
    c = json.load(open(f"{work}/{name}-hf/config.json"))
    assert c["dtype"] == c["torch_dtype"] == "float16", c
print("bytes and gpt2: transformers' ids are the trainer's over", len(texts), "texts")
PY
    run "$trainer" "${tiny[@]}" --set data.tokenizer=bytes --set data.vocab_size=256 \
      --set checkpoint.dir="$work/bytes" --export-hf "$work/int8" --export-dtype int8
    expect_rc 2; expect_grep "export-dtype: int8 not in \{bf16,fp16,fp32\}"
    [ ! -e "$work/int8" ] || fail "--export-dtype int8 wrote $(ls "$work/int8")" ;;
  generate_greedy)
    # --generate --temperature 0 from a byte-level Hugging Face model writes what transformers'
    # generate(do_sample=False) writes, byte for byte; under mpirun, once.
    py make "$work/hf" --vocab 256 --layers 2 --heads 4 --width 64 --positions 64 --seed 5 >/dev/null 2>&1 \
      || fail "could not make the transformers model"
    py greedy "$work/hf" "Hello, wor" 24 >"$work/expected.txt" || fail "transformers' greedy failed"
    run "$trainer" "${tiny[@]}" --set model.init_from="$work/hf" --generate "Hello, wor" \
      --temperature 0 --max-new-tokens 24
    expect_rc 0; expect_grep "weights: model.init_from $work/hf"
    grep -av "^trainer: " "$out" | cmp - "$work/expected.txt" \
      || fail "generated $(grep -av '^trainer: ' "$out" | od -c | head -3), transformers $(od -c "$work/expected.txt" | head -3)"
    run mpirun -np 2 "$trainer" "${tiny[@]}" --set model.init_from="$work/hf" --generate "Hello, wor" \
      --temperature 0 --max-new-tokens 24
    expect_rc 0
    [ "$(grep -c "Hello, wor" "$out")" = 1 ] || fail "not printed once under mpirun"
    # Sampling: the same seed, the same text; the context (64) caps the new tokens.
    run "$trainer" "${tiny[@]}" --set model.init_from="$work/hf" --generate "Hi" --seed 3 --max-new-tokens 100
    expect_rc 0; expect_grep "the model holds 64 positions: 62 new tokens after the prompt's 2"
    cp "$out" "$work/a.txt"
    run "$trainer" "${tiny[@]}" --set model.init_from="$work/hf" --generate "Hi" --seed 3 --max-new-tokens 100
    cmp -s "$out" "$work/a.txt" || fail "the same seed gave another text" ;;
  generate_oom)
    # --generate runs under the config's memory limits, and its errors exit through the launcher's
    # table (launcher/exit_status.h): a CPU budget (memory.cpu_budget_mb) too small for the model
    # is out of memory, exit 4 with the usual message; --export-hf of a checkpoint alike (without
    # weights to export it is a user mistake, exit 2, before anything is allocated).
    run mpirun -np 2 "$trainer" "${tiny[@]}" --set memory.cpu_budget_mb=0.1 --generate "Hello"
    expect_rc 4
    expect_grep "^trainer: error: out of memory in --generate: CPU out of memory: .*memory.cpu_budget_mb"
    expect_grep "Give each rank more memory \(memory.cpu_budget_mb on CPU"
    [ "$(grep -c "out of memory" "$out")" = 1 ] || fail "not said once under mpirun"
    run "$trainer" "${tiny[@]}" --set memory.cpu_budget_mb=0.1 --export-hf "$work/out"
    expect_rc 2; expect_grep "^trainer: error: --export-hf: no weights to export"
    run "$trainer" "${tiny[@]}" --set train.steps=1 --set checkpoint.dir="$work/ckpt"
    expect_rc 0
    run "$trainer" "${tiny[@]}" --set checkpoint.dir="$work/ckpt" --set memory.cpu_budget_mb=0.1 \
      --export-hf "$work/out"
    expect_rc 4; expect_grep "^trainer: error: out of memory in --export-hf: "
    # The same command with room for the model generates.
    run "$trainer" "${tiny[@]}" --set memory.cpu_budget_mb=64 --generate "Hello" --max-new-tokens 8
    expect_rc 0; expect_grep "^Hello" ;;
  sample_every_same_losses)
    # train.sample_every logs samples and changes nothing else: every logged loss is the same
    # as without it (dropout on, so the random stream matters).
    common=("${tiny[@]}" --set train.steps=30 --set model.dropout=0.1)
    run mpirun -np 2 "$trainer" "${common[@]}"
    expect_rc 0; grep -E "step +[0-9]+/30" "$out" | sed -E 's/.*(step +[0-9]+\/30 loss [0-9.]+ lr [^ ]+ grad_norm [0-9.]+).*/\1/' >"$work/plain.txt"
    run mpirun -np 2 "$trainer" "${common[@]}" --set train.sample_every=10 --set train.sample_tokens=40
    expect_rc 0
    expect_grep "sample at step 10: "; expect_grep "sample at step 30: "
    grep -E "step +[0-9]+/30" "$out" | sed -E 's/.*(step +[0-9]+\/30 loss [0-9.]+ lr [^ ]+ grad_norm [0-9.]+).*/\1/' >"$work/sampled.txt"
    [ -s "$work/plain.txt" ] || fail "no step lines"
    diff "$work/plain.txt" "$work/sampled.txt" || fail "losses changed with train.sample_every"
    grep "sample at step 30" "$out" ;;
  lm_errors)
    # init_from: a missing file; a dimension the config sets otherwise (both named).
    run mpirun -np 2 "$trainer" "${tiny[@]}" --set model.init_from="$work/nothing"
    expect_rc 2; expect_grep "model.init_from: $work/nothing: no such file or directory"
    py make "$work/hf" --vocab 256 --layers 2 --heads 4 --width 64 --positions 64 >/dev/null 2>&1 \
      || fail "could not make the transformers model"
    run mpirun -np 2 "$trainer" "${tiny[@]}" --set model.init_from="$work/hf" --set model.d_model=96
    expect_rc 2; expect_grep "has width 64, the config has model.d_model = 96"
    # --export-hf: no checkpoint and no init_from; a model that is not a gpt.
    run "$trainer" "${tiny[@]}" --set checkpoint.dir="$work/empty" --export-hf "$work/out"
    expect_rc 2; expect_grep "--export-hf: no weights to export: no checkpoint in checkpoint.dir \($work/empty\)"
    [ ! -e "$work/out/model.safetensors" ] || fail "wrote a model anyway"
    run "$trainer" --config "$src/configs/mlp.yaml" --export-hf "$work/out"
    expect_rc 2; expect_grep "--export-hf needs a language model \(model.name: gpt, llama, qwen2, qwen3, mistral, gemma3\); this config has model.name: mlp"
    # data.tokenizer: auto cannot choose for 300 ids.
    run "$trainer" "${tiny[@]}" --set data.vocab_size=300 --generate "x"
    expect_rc 2; expect_grep "data.tokenizer: auto knows no encoding with data.vocab_size = 300" ;;
  tokenizer_json_uint32)
    # A byte-level BPE tokenizer.json trained with `tokenizers` (offline) whose ids pass 65,535
    # (tests/unit/bpe_reference.py's "wide": Llama 3's pattern, ids from 69,000):
    # scripts/tokenize_text.py --tokenizer writes uint32 shards in llm.c's Llama 3 format; 2 ranks
    # train on them, sampling through the C++ tokenizer; --generate prints text through it; and an
    # --export-hf directory, which carries the run's tokenizer.json, is picked up by
    # model.init_from with data.tokenizer left at auto.
    "$TRAINER_PYTHON" "$src/tests/unit/bpe_reference.py" "$work/ref" >"$out" 2>&1 || fail "bpe_reference.py failed"
    tok=$work/ref/wide/tokenizer.json
    "$TRAINER_PYTHON" - "$src/tests/unit" "$work/docs.jsonl" <<'PY' || fail "could not write the corpus"
import json, sys
sys.path.insert(0, sys.argv[1])
from bpe_reference import DOCS
with open(sys.argv[2], "w", encoding="utf-8") as f:
    for d in DOCS * 4:
        f.write(json.dumps({"text": d}) + "\n")
PY
    run "$TRAINER_PYTHON" "$src/scripts/tokenize_text.py" "$work/docs.jsonl" "$work/shards" --tokenizer "$tok"
    expect_rc 0; expect_grep "of uint32 -> $work/shards; .*data.vocab_size: 7[0-9]{4}, data.tokenizer: $tok"
    vocab=$(sed -nE 's/.*data.vocab_size: ([0-9]+),.*/\1/p' "$out")
    lm=("${tiny[@]}" --set data.path="$work/shards" --set data.vocab_size="$vocab" --set data.context=32
      --set model.context=32 --set train.global_batch_size=8 --set train.eval_every=6 --set train.eval_samples=4)
    run mpirun -np 2 "$trainer" "${lm[@]}" --set data.tokenizer="$tok" --set train.steps=6 \
      --set train.sample_every=6 --set train.sample_prompt="Café naïve" --set train.sample_tokens=8 \
      --set checkpoint.dir="$work/ckpt"
    expect_rc 0; expect_grep "done: 6 steps"; expect_grep "sample at step 6: Café naïve \| "
    run "$trainer" "${lm[@]}" --set data.tokenizer="$tok" --set checkpoint.dir="$work/ckpt" \
      --generate "日本語 👍🏽" --max-new-tokens 8 --seed 1
    expect_rc 0; expect_grep "^日本語 👍🏽"
    # A token id above the vocabulary stops every rank before step 1, naming the file and offset.
    run mpirun -np 2 "$trainer" "${lm[@]}" --set data.vocab_size=70000 --set train.steps=2
    expect_rc 2; expect_grep "$work/shards/train_000000.bin: byte offset [0-9]+: token id 7[0-9]+ is not below data.vocab_size = 70000"
    expect_no_grep "step +1/2"
    # model.init_from picks up the tokenizer.json beside the weights.
    run "$trainer" "${lm[@]}" --set checkpoint.dir="$work/ckpt" --set data.tokenizer="$tok" --export-hf "$work/hf"
    expect_rc 0; expect_grep "\(the tokenizer from $tok\)"
    run "$trainer" "${lm[@]}" --set model.init_from="$work/hf" --generate "<|endoftext|>x" --max-new-tokens 4
    expect_rc 0; expect_grep "weights: model.init_from $work/hf"; expect_grep "^<\|endoftext\|>x"
    run "$trainer" "${lm[@]}" --set model.init_from="$work/hf" --set data.vocab_size=1000 --generate "x"
    expect_rc 2; expect_grep "data.tokenizer: $work/hf/tokenizer.json ids go up to $((vocab - 1)), above data.vocab_size = 1000" ;;
  llama_generate_greedy)
    # A byte-level Hugging Face Llama (6 heads over 2 kv heads, untied, llama3 rope scaling) through
    # model.init_from: --generate --temperature 0 writes what transformers' generate(do_sample=False)
    # writes, byte for byte. Then --export-hf in shards (--max-shard-size) that from_pretrained
    # loads with no key missing or unexpected.
    pyllama make "$work/hf" --vocab 256 --layers 2 --heads 6 --kv-heads 2 --width 48 \
      --intermediate 96 --positions 64 --untied --rope-scaling --seed 5 >/dev/null 2>&1 \
      || fail "could not make the transformers model"
    pyllama greedy "$work/hf" "Hello, wor" 24 >"$work/expected.txt" || fail "transformers' greedy failed"
    run "$trainer" "${llama[@]}" --set model.init_from="$work/hf" --generate "Hello, wor" \
      --temperature 0 --max-new-tokens 24
    expect_rc 0; expect_grep "weights: model.init_from $work/hf"
    grep -av "^trainer: " "$out" | cmp - "$work/expected.txt" \
      || fail "generated $(grep -av '^trainer: ' "$out" | od -c | head -3), transformers $(od -c "$work/expected.txt" | head -3)"
    # data.context above the file's 64 positions: --export-hf reads no data, so it does not care.
    run "$trainer" "${llama[@]}" --set model.init_from="$work/hf" --set data.context=128 \
      --export-hf "$work/out" --max-shard-size 50KB
    expect_rc 0; expect_grep "wrote $work/out/config.json and [0-9]+ weight files from model.init_from"
    [ -s "$work/out/model.safetensors.index.json" ] || fail "no index: $(ls "$work/out")"
    "$TRAINER_PYTHON" -c "import torch; from safetensors.torch import save_file; save_file({'inputs': torch.arange(64).view(2, 32)}, '$work/in.safetensors')"
    run pyllama logits "$work/out" "$work/in.safetensors" "$work/logits.safetensors"
    expect_rc 0
    run "$trainer" "${llama[@]}" --set model.init_from="$work/hf" --export-hf "$work/out2" --max-shard-size 5parsecs
    expect_rc 2; expect_grep "--max-shard-size: '5parsecs' is not a size" ;;
  llama_spm_generate_greedy)
    # A Hugging Face Llama with a SentencePiece-style tokenizer.json beside its weights
    # (tests/unit/bpe_reference.py's spm-llama2: Llama 2's Prepend + Replace normalizer, byte
    # fallback, the ByteFallback + Fuse + Strip decoder; saved by transformers'
    # PreTrainedTokenizerFast), picked up with data.tokenizer left at auto: --generate
    # --temperature 0 writes the text transformers' generate(do_sample=False) and decode write,
    # byte for byte. The prompt's CJK characters are not in the vocabulary (their bytes' tokens);
    # the first new token starts with "▁" (" per"), a space the decoder keeps after the prompt
    # (data::decode_continuation); the byte tokens' output embeddings are zero, so the
    # continuation is whole characters. Then train.sample_every samples through the file, and a
    # decoder the trainer does not read is exit 2.
    "$TRAINER_PYTHON" "$src/tests/unit/bpe_reference.py" "$work/ref" >"$out" 2>&1 || fail "bpe_reference.py failed"
    tok=$work/ref/spm-llama2/tokenizer.json
    vocab=$("$TRAINER_PYTHON" -c "import sys, tokenizers; print(tokenizers.Tokenizer.from_file(sys.argv[1]).get_vocab_size())" "$tok") \
      || fail "could not read $tok"
    pyllama make "$work/hf" --vocab "$vocab" --layers 2 --heads 6 --kv-heads 2 --width 48 \
      --intermediate 96 --positions 64 --untied --seed 5 --tokenizer "$tok" >/dev/null 2>&1 \
      || fail "could not make the transformers model"
    prompt="The 日本 quick"
    pyllama greedy "$work/hf" "$prompt" 24 >"$work/expected.txt" || fail "transformers' greedy failed"
    run "$trainer" "${llama[@]}" --set data.vocab_size="$vocab" --set model.init_from="$work/hf" \
      --generate "$prompt" --temperature 0 --max-new-tokens 24
    expect_rc 0; expect_grep "weights: model.init_from $work/hf"
    grep -av "^trainer: " "$out" | cmp - "$work/expected.txt" \
      || fail "generated $(grep -av '^trainer: ' "$out" | od -c | head -3), transformers $(od -c "$work/expected.txt" | head -3)"
    grep -av "^trainer: " "$out"
    # train.sample_every samples through the same file (the byte shards' ids are ids of it too).
    run "$trainer" "${llama[@]}" --set data.vocab_size="$vocab" --set model.init_from="$work/hf" \
      --set train.steps=2 --set train.sample_every=2 --set train.sample_prompt="The 日本 quick" \
      --set train.sample_tokens=6
    expect_rc 0; expect_grep "sample at step 2: The 日本 quick \| "
    # A decoder the trainer does not read stops it with exit 2, naming the file and the key.
    "$TRAINER_PYTHON" - "$tok" "$work/bad.json" <<'PY' || fail "could not write bad.json"
import json, sys
j = json.load(open(sys.argv[1], encoding="utf-8"))
j["decoder"]["decoders"][1] = {"type": "CTC"}
json.dump(j, open(sys.argv[2], "w", encoding="utf-8"))
PY
    run "$trainer" "${llama[@]}" --set data.vocab_size="$vocab" --set model.init_from="$work/hf" \
      --set data.tokenizer="$work/bad.json" --generate "x"
    expect_rc 2; expect_grep "data.tokenizer: $work/bad.json: decoder.decoders\[1\]: decoder CTC is not read" ;;
  llama_hf_tokenizer_finetune_np2)
    # A user's Llama pipeline end to end: a byte-level BPE tokenizer.json (trained offline with
    # `tokenizers`: tests/unit/bpe_reference.py's llama3-pattern) tokenizes a JSONL corpus with
    # scripts/tokenize_text.py --tokenizer; a random Hugging Face LlamaForCausalLM of that
    # vocabulary (grouped-query attention, untied) with the tokenizer.json beside its weights is
    # fine-tuned on 2 ranks through model.init_from (data.tokenizer left at auto). The global batch
    # is every window of the shard, so step 1's loss is transformers' mean loss over the shard: the
    # weights and the ids arrived. The loss falls, and --generate prints text through the C++
    # tokenizer.
    "$TRAINER_PYTHON" "$src/tests/unit/bpe_reference.py" "$work/ref" >"$out" 2>&1 || fail "bpe_reference.py failed"
    "$TRAINER_PYTHON" - "$src/tests/unit" "$work/docs.jsonl" <<'PY' || fail "could not write the corpus"
import json, sys
sys.path.insert(0, sys.argv[1])
from bpe_reference import DOCS
with open(sys.argv[2], "w", encoding="utf-8") as f:
    for d in DOCS * 4:
        f.write(json.dumps({"text": d}) + "\n")
PY
    run "$TRAINER_PYTHON" "$src/scripts/tokenize_text.py" "$work/docs.jsonl" "$work/shards" \
      --tokenizer "$work/ref/llama3-pattern/tokenizer.json"
    expect_rc 0; expect_grep "of uint16 -> $work/shards; "
    vocab=$(sed -nE 's/.*data.vocab_size: ([0-9]+),.*/\1/p' "$out")
    [ -n "$vocab" ] || fail "tokenize_text.py printed no data.vocab_size"
    pyllama make "$work/hf" --vocab "$vocab" --layers 2 --heads 4 --kv-heads 2 --width 64 \
      --intermediate 128 --positions 64 --untied --seed 3 >/dev/null 2>&1 \
      || fail "could not make the transformers model"
    cp "$work/ref/llama3-pattern/tokenizer.json" "$work/hf/"
    expected=$(pyllama loss "$work/hf" "$work/shards/train_000000.bin" 32) || fail "reference loss: $expected"
    windows=$(sed -E 's/.* over ([0-9]+) windows/\1/' <<<"$expected")
    lm=(--config "$src/configs/llama-tiny.yaml" --set model.init_from="$work/hf" --set data.path="$work/shards"
      --set data.vocab_size="$vocab" --set data.context=32 --set train.device=cpu --set train.warmup_steps=2
      --set train.global_batch_size="$windows" --set train.lr=0.003 --set train.eval_every=30
      --set train.eval_samples=8 --set train.sample_every=0 --set checkpoint.dir="$work/ckpt" --set log.every=10)
    run mpirun -np 2 "$trainer" "${lm[@]}" --set train.steps=30
    expect_rc 0
    expect_grep "model.init_from: Hugging Face Llama $work/hf \(2 blocks, 64 wide, 4 heads over 2 kv heads"
    expect_imported_then_falls "${expected%% *}"
    run "$trainer" "${lm[@]}" --generate "The quick brown" --max-new-tokens 12 --temperature 0
    expect_rc 0; expect_grep "weights: .*$work/ckpt/final.safetensors"; expect_grep "^The quick brown"
    grep "^The quick brown" "$out" ;;
  llama_sft_chat_np2)
    # Supervised fine-tuning as a user runs it (configs/llama-sft.yaml): a random Hugging Face
    # LlamaForCausalLM with a trained tokenizer.json and Llama 3's chat template beside it (the
    # sample chat set's), 40 conversations of data/chat-sample -> scripts/tokenize_text.py --chat
    # -> shards with masks and boundaries -> 2 ranks of SFT through model.init_from, packed
    # documents. The global batch is every window, so step 1's loss is the masked mean loss that
    # transformers computes on the same packed windows (tests/hf/sft_loss.py: its own packing,
    # position ids and block-diagonal mask), within 1e-6 (they agree to about 2e-8; a random
    # model's losses are so alike that weighting micro-batches by samples instead of targets
    # moves it by 1.6e-6 only). Then --generate --chat prints a reply.
    pyllama make "$work/hf" --vocab 2048 --layers 2 --heads 4 --kv-heads 2 --width 64 \
      --intermediate 128 --positions 128 --untied --seed 5 >/dev/null 2>&1 \
      || fail "could not make the transformers model"
    cp "$src/data/chat-sample/tokenizer/tokenizer.json" "$src/data/chat-sample/tokenizer/tokenizer_config.json" "$work/hf/"
    head -n 40 "$src/data/chat-sample/chat.jsonl" >"$work/chat.jsonl"
    run "$TRAINER_PYTHON" "$src/scripts/tokenize_text.py" --chat --tokenizer "$work/hf/tokenizer.json" \
      "$work/chat.jsonl" "$work/shards" --workers 1
    expect_rc 0; expect_grep "40 conversations"
    [ -f "$work/shards/chat.json" ] || fail "no chat.json beside the shards"
    expected=$("$TRAINER_PYTHON" "$src/tests/hf/sft_loss.py" "$work/hf" "$work/shards" 96 2>/dev/null) \
      || fail "reference loss: $expected"
    windows=$(sed -E 's/.* over ([0-9]+) windows/\1/' <<<"$expected")
    sft=(--config "$src/configs/llama-sft.yaml" --set model.init_from="$work/hf" --set data.path="$work/shards"
      --set data.context=96 --set data.tokenizer=auto --set train.device=cpu --set train.warmup_steps=1
      --set train.global_batch_size="$windows" --set train.eval_every=3 --set train.eval_samples=4
      --set checkpoint.dir="$work/ckpt" --set checkpoint.every=0 --set log.every=1)
    run mpirun -np 2 "$trainer" "${sft[@]}" --set train.steps=3
    expect_rc 0
    expect_grep "data.packing: documents: $windows windows of 96 positions: tokens [0-9.]+%, targets"
    expect_grep "eval step 3: loss [0-9.]+ bpb"
    step1=$("$TRAINER_PYTHON" -c "import json,sys; print([r for r in map(json.loads, open(sys.argv[1])) if r.get('step') == 1 and r['type'] == 'step'][0]['loss'])" "$work/ckpt/metrics.jsonl") \
      || fail "no step 1 in metrics.jsonl"
    awk -v a="$step1" -v b="${expected%% *}" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 1e-6 * b) }' \
      || fail "step 1 loss $step1, transformers' masked mean over the packed windows ${expected%% *}"
    echo "step 1 loss $step1 = transformers' ${expected%% *} over $windows packed windows"
    run "$trainer" "${sft[@]}" --generate --chat "What does data.packing do?" --max-new-tokens 12 --temperature 0
    expect_rc 0; expect_grep "weights: .*$work/ckpt/final.safetensors"
    expect_grep "chat: the user's turn rendered as $work/shards/chat.json"
    [ "$(grep -cv '^trainer: ' "$out")" -ge 1 ] || fail "no reply printed"
    grep -v '^trainer: ' "$out"
    run "$trainer" "${sft[@]}" --generate "x" --chat "y"
    expect_rc 2; expect_grep "PROMPT or --chat QUESTION, not both"
    run "$trainer" "${sft[@]}" --set data.path="$src/data/tokens-sample" --generate --chat "y"
    expect_rc 2; expect_grep "--chat: no chat.json in data.path"
    # Broken sidecars stop both ranks before step 1 with exit 2, naming the file and offset: a
    # mask one byte short of its shard, then a last boundary past the shard's end.
    cp -r "$work/shards" "$work/bad"
    m=$work/bad/train_000000.mask d=$work/bad/train_000000.docs
    truncate -s -1 "$m"
    run mpirun -np 2 "$trainer" "${sft[@]}" --set data.path="$work/bad" --set train.steps=1
    expect_rc 2; expect_grep "$m: the header \(byte offset 16\) says [0-9]+ tokens and [0-9]+ bytes follow it"
    expect_no_grep "step +1/"
    cp "$work/shards/train_000000.mask" "$m"
    "$TRAINER_PYTHON" - "$d" <<'PY' || fail "could not edit $d"
import sys
import numpy as np
a = np.fromfile(sys.argv[1], dtype="<u8")
a[-1] += 1
a.tofile(sys.argv[1])
PY
    run mpirun -np 2 "$trainer" "${sft[@]}" --set data.path="$work/bad" --set train.steps=1
    expect_rc 2; expect_grep "$d: byte offset [0-9]+: boundary [0-9]+ is past the end of its token shard"
    expect_no_grep "step +1/" ;;
  qwen3_sft_chatml_np2)
    # SFT on one of Llama's kin with Qwen's ChatML: a random Hugging Face Qwen3ForCausalLM (q and
    # k norms, head_dim 12; no window: the reference's packed mask would override it) with the
    # sample tokenizer
    # plus <|im_start|> and <|im_end|> and Qwen2.5's template (tests/hf/chatml.py) -> tokenize_text.py
    # --chat: the masks are 1 on each assistant turn and its <|im_end|> and nowhere else -> 2 ranks
    # of SFT: step 1's loss is transformers' masked mean over the same packed windows within 1e-6.
    "$TRAINER_PYTHON" "$src/tests/hf/chatml.py" tokenizer "$src/data/chat-sample/tokenizer" "$work/hf" \
      >"$work/vocab" || fail "chatml.py tokenizer"
    vocab=$(cat "$work/vocab")
    pyllama make "$work/hf" --model-type qwen3 --vocab "$vocab" --layers 2 --heads 4 --kv-heads 2 \
      --width 64 --head-dim 12 --intermediate 128 --positions 128 --untied --seed 5 \
      >/dev/null 2>&1 || fail "could not make the transformers model"
    head -n 30 "$src/data/chat-sample/chat.jsonl" >"$work/chat.jsonl"
    run "$TRAINER_PYTHON" "$src/scripts/tokenize_text.py" --chat --tokenizer "$work/hf/tokenizer.json" \
      "$work/chat.jsonl" "$work/shards" --workers 1
    expect_rc 0; expect_grep "30 conversations"
    run "$TRAINER_PYTHON" "$src/tests/hf/chatml.py" check-masks "$work/hf" "$work/shards" "$work/chat.jsonl"
    expect_rc 0; expect_grep "the masks cover the assistant turns only"
    expected=$("$TRAINER_PYTHON" "$src/tests/hf/sft_loss.py" "$work/hf" "$work/shards" 96 2>/dev/null) \
      || fail "reference loss: $expected"
    windows=$(sed -E 's/.* over ([0-9]+) windows/\1/' <<<"$expected")
    run mpirun -np 2 "$trainer" --config "$src/configs/llama-sft.yaml" --set model.name=qwen3 \
      --set model.preset=qwen3-tiny --set model.init_from="$work/hf" --set data.path="$work/shards" \
      --set data.vocab_size="$vocab" --set data.context=96 --set data.tokenizer=auto \
      --set train.device=cpu --set train.warmup_steps=1 --set train.global_batch_size="$windows" \
      --set train.eval_every=0 --set checkpoint.dir="$work/ckpt" --set checkpoint.every=0 \
      --set log.every=1 --set train.steps=2
    expect_rc 0; expect_grep "model.init_from: Hugging Face Qwen3 $work/hf \(2 blocks, 64 wide"
    step1=$("$TRAINER_PYTHON" -c "import json,sys; print([r for r in map(json.loads, open(sys.argv[1])) if r.get('step') == 1 and r['type'] == 'step'][0]['loss'])" "$work/ckpt/metrics.jsonl") \
      || fail "no step 1 in metrics.jsonl"
    awk -v a="$step1" -v b="${expected%% *}" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 1e-6 * b) }' \
      || fail "step 1 loss $step1, transformers' masked mean over the packed windows ${expected%% *}"
    echo "step 1 loss $step1 = transformers' ${expected%% *} over $windows packed windows" ;;
  llama_tiny_np2)
    # configs/llama-tiny.yaml on 2 CPU ranks (shortened): the loss falls and a sample is written.
    run mpirun -np 2 "$trainer" --config "$src/configs/llama-tiny.yaml" --set data.path="$src/data/tokens-sample" \
      --set train.device=cpu --set train.steps=30 --set train.sample_every=30 --set train.eval_every=30 \
      --set train.sample_tokens=24 --set log.every=10
    expect_rc 0; expect_grep "sample at step 30: "
    losses
    awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < 0.8 * f) }' || fail "loss did not fall: $first -> $last"
    grep "sample at step 30" "$out" ;;
  lora_llama_np2)
    # LoRA (model.lora_rank) on a Hugging Face Llama (grouped queries, untied) at 2 CPU ranks under
    # ddp.shard: parameters; --export-peft loads in PEFT with the keys exact, the merged
    # --export-hf equals merge_and_unload() (tests/hf/lora_peft.py); --generate and --evaluate run
    # with the adapters; bad LoRA input exits 2 naming the key or the file.
    pyllama make "$work/hf" --vocab 256 --layers 2 --heads 4 --kv-heads 2 --width 64 \
      --intermediate 96 --positions 64 --untied --seed 4 >/dev/null 2>&1 || fail "could not make the base"
    lora=(--config "$src/configs/llama-tiny.yaml" --set data.path="$src/data/tokens-sample"
      --set train.device=cpu --set data.context=32 --set model.init_from="$work/hf"
      --set model.lora_rank=4 --set model.lora_alpha=8 --set train.warmup_steps=0
      --set 'model.lora_targets=[q_proj, v_proj, down_proj]' --set checkpoint.dir="$work/ckpt")
    run mpirun -np 2 "$trainer" "${lora[@]}" --set ddp.shard=parameters --set train.steps=12 \
      --set train.eval_every=12 --set train.sample_every=0 --set log.every=4
    expect_rc 0
    expect_grep "model.lora: rank 4, alpha 8 \(scale 2\), dropout 0, on q_proj, v_proj, down_proj \(6 layers\): [0-9]+ parameters train"
    losses; echo "LoRA loss $first -> $last"
    # The checkpoint holds the adapters and their moments, not the frozen base, and names the base.
    "$TRAINER_PYTHON" - "$work/ckpt/final" "$work/hf" <<'PY' || fail "the LoRA checkpoint holds more than the adapters"
import json, os, sys
d, base = sys.argv[1:]
m = json.load(open(os.path.join(d, "manifest.json")))
size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
base_size = os.path.getsize(os.path.join(base, "model.safetensors"))
print(f"LoRA checkpoint {size} bytes on disk, the base's model.safetensors {base_size} bytes")
other = [k for k in m["tensors"] if ".lora_" not in k]
assert not other, other
assert m["base"] == base and m["base_hash"].startswith("crc32:"), (m.get("base"), m.get("base_hash"))
assert size < base_size / 4, (size, base_size)
PY
    # Resumed on 3 ranks under another ddp.shard: the base from model.init_from, the adapters
    # from the checkpoint.
    cp -r "$work/ckpt" "$work/ckpt3"
    run mpirun -np 3 "$trainer" "${lora[@]}" --set checkpoint.dir="$work/ckpt3" \
      --set checkpoint.resume=auto --set ddp.shard=none --set train.steps=16 --set log.every=4
    expect_rc 0; expect_grep "model.init_from $work/hf: the frozen base; its adapters and their optimizer state from $work/ckpt3/final"
    expect_grep "step +16/16"
    # And that single file back onto 2 ranks under parameters, built without storage: each rank
    # reads its blocks of the adapters and their moments, and of the base from model.init_from.
    cp -r "$work/ckpt3" "$work/ckpt4"
    run mpirun -np 2 "$trainer" "${lora[@]}" --set checkpoint.dir="$work/ckpt4" \
      --set checkpoint.resume=auto --set ddp.shard=parameters --set train.steps=20 --set log.every=4
    expect_rc 0; expect_grep "its adapters and their optimizer state from $work/ckpt4/final"
    expect_grep "step +20/20"
    # Onto another base (wider MLP): refused, naming both.
    pyllama make "$work/hf2" --vocab 256 --layers 2 --heads 4 --kv-heads 2 --width 64 \
      --intermediate 128 --positions 64 --untied --seed 4 >/dev/null 2>&1 || fail "could not make the other base"
    run "$trainer" "${lora[@]}" --set checkpoint.dir="$work/ckpt3" --set checkpoint.resume=auto \
      --set model.init_from="$work/hf2" --set train.steps=20
    expect_rc 2
    expect_grep "holds LoRA adapters of the base '$work/hf' \(crc32:[0-9a-f]+\), and model.init_from is the base '$work/hf2' \(crc32:[0-9a-f]+\): another base"
    # Muon's matrices are the frozen ones: refused at start-up naming both keys.
    run "$trainer" "${lora[@]}" --set train.optimizer=muon --set train.steps=1 --set checkpoint.dir=
    expect_rc 2; expect_grep "train.optimizer: muon updates the hidden layers' weight matrices, which model.lora_rank = 4 freezes"
    # data.context above the base's 64 positions: the exports read no data, so they do not care.
    run "$trainer" "${lora[@]}" --set data.context=128 --export-peft "$work/adapter"
    expect_rc 0; expect_grep "wrote $work/adapter/adapter_config.json"
    # The base by its absolute path; by the Hub id its config.json records, where it has one.
    grep -q "\"base_model_name_or_path\": \"$work/hf\"" "$work/adapter/adapter_config.json" \
      || fail "the base: $(grep base_model "$work/adapter/adapter_config.json")"
    cp -r "$work/hf" "$work/hub"
    sed -i '1s/^{/{\n  "_name_or_path": "some-org\/llama-base",/' "$work/hub/config.json"
    hub=(--set model.init_from="$work/hub" --set checkpoint.dir="$work/hubckpt")
    run "$trainer" "${lora[@]}" "${hub[@]}" --set train.steps=1 --set train.eval_every=0
    expect_rc 0
    run "$trainer" "${lora[@]}" "${hub[@]}" --export-peft "$work/hub-adapter"
    expect_rc 0; expect_grep "over the base some-org/llama-base\)"
    run "$trainer" "${lora[@]}" --set data.context=128 --export-hf "$work/merged"
    expect_rc 0
    "$TRAINER_PYTHON" -c "import torch; from safetensors.torch import save_file; save_file({'inputs': torch.randint(0, 256, (2, 16))}, '$work/in.safetensors')"
    run "$TRAINER_PYTHON" "$src/tests/hf/lora_peft.py" check "$work/hf" "$work/adapter" \
      "$work/in.safetensors" "$work/peft.safetensors" --merged "$work/merged"
    expect_rc 0
    "$TRAINER_PYTHON" -c "
from safetensors.torch import load_file
d = load_file('$work/peft.safetensors')
diff = (d['merged_logits'] - d['logits']).abs().max().item()
print('merged vs PEFT weights', d['merged_diff'].item(), 'logits', diff)
assert d['merged_diff'].item() < 1e-5 and diff < 1e-4" || fail "merged export differs from PEFT's"
    run "$trainer" "${lora[@]}" --generate "The quick" --max-new-tokens 8 --temperature 0
    expect_rc 0; expect_grep "weights: checkpoint $work/ckpt/final \(12 steps done\)"; expect_grep "^The quick"
    run mpirun -np 2 "$trainer" "${lora[@]}" --evaluate
    expect_rc 0; expect_grep "model.lora: rank 4"
    # Bad input: exit 2, naming the key or the file.
    run "$trainer" "${lora[@]}" --set 'model.lora_targets=[c_attn]' --set train.steps=1
    expect_rc 2; expect_grep "model.lora_targets: 'c_attn' matches no layer of llama"
    run "$trainer" "${lora[@]}" --set model.lora_rank=33 --set train.steps=1 --set checkpoint.dir=
    expect_rc 2; expect_grep "model.lora_rank: 33 is above the smaller dimension \(32\) of layers.0.self_attn.v_proj"
    run "$trainer" "${lora[@]}" --set model.lora_rank=0 --set train.steps=1
    expect_rc 2; expect_grep "model.lora_rank: 0 with model.lora_targets"
    # The exported adapter as model.lora_init_from under ddp.shard: parameters (built without
    # storage: each rank reads its blocks of the adapters), and in a plan from the shapes
    # (--dry-run, which stopped on a segmentation fault before).
    run mpirun -np 2 "$trainer" "${lora[@]}" --set model.lora_init_from="$work/adapter" \
      --set ddp.shard=parameters --set train.steps=1 --set checkpoint.dir=
    expect_rc 0; expect_grep "model.lora_init_from: the adapters of $work/adapter"
    run "$trainer" "${lora[@]}" --set model.lora_init_from="$work/adapter" --dry-run \
      --plan-ranks 8 --plan-device-memory 80GiB
    expect_rc 0; expect_grep "dry run: nothing trained"
    run "$trainer" "${lora[@]}" --set model.lora_init_from="$work/adapter" --set model.lora_rank=2 \
      --set train.steps=1 --set checkpoint.dir=
    expect_rc 2; expect_grep "model.lora_init_from: $work/adapter/adapter_config.json: r is 4 but model.lora_rank is 2" ;;
  eval_tasks_match_transformers)
    # eval.tasks in both formats (llm.c's .bin, JSON Lines through the run's tokenizer.json) and
    # bits per byte, against tests/hf/hf_tasks.py's computation from the definitions with
    # transformers on the same weights (--export-hf of the final checkpoint): the acc and
    # acc_norm counts exactly, bpb within 1e-4; in the loop at 2 ranks (log, metrics.jsonl,
    # TensorBoard) and with --evaluate at 1 and 3 ranks; 7 examples do not divide by 2 or 3.
    eval_setup
    pytasks tasks "$work/tasks" "$tok" 7 --seed 3 || fail "hf_tasks.py tasks"
    tasks=(--set eval.tasks="[$work/tasks/randbin.bin,$work/tasks/words.jsonl]")
    run mpirun -np 2 "$trainer" "${evalrun[@]}" "${tasks[@]}" --set train.steps=4 \
      --set checkpoint.dir="$work/ckpt" --set log.tensorboard="$work/tb"
    expect_rc 0
    run "$trainer" "${evalrun[@]}" --set checkpoint.dir="$work/ckpt" --export-hf "$work/hf"
    expect_rc 0
    pytasks score "$work/hf" "$tok" "$work/shards/val_000000.bin" 16 "$work/tasks/randbin.bin" \
      "$work/tasks/words.jsonl" >"$work/reference.txt" || fail "hf_tasks.py score: $(cat "$work/reference.txt")"
    cat "$work/reference.txt"
    grep -v "^bpb " "$work/reference.txt" >"$work/expected.txt"
    bpb=$(sed -nE 's/^bpb ([0-9.]+) .*/\1/p' "$work/reference.txt")
    run "$TRAINER_PYTHON" - "$work/ckpt/metrics.jsonl" "$work/expected.txt" "$bpb" "$work/tb" <<'PY'
import json, re, sys
rec = [json.loads(line) for line in open(sys.argv[1]) if '"eval"' in line][-1]
for line in open(sys.argv[2]):
    name, acc, n, norm = re.match(r"(\w+): acc (\d+)/(\d+), acc_norm (\d+)/", line).groups()
    got = rec[name]
    if (got["acc"], got["acc_norm"], got["examples"]) != (int(acc), int(norm), int(n)):
        sys.exit(f"{name}: metrics.jsonl {got}, transformers {line.strip()}")
if abs(rec["bpb"] - float(sys.argv[3])) > 1e-4:
    sys.exit(f"bpb {rec['bpb']}, transformers {sys.argv[3]}")
try:
    from tensorboard.backend.event_processing import event_accumulator as ea
except ImportError:
    sys.exit("tensorboard is not installed (scripts/bootstrap.sh --dev installs it)")
acc = ea.EventAccumulator(sys.argv[4], size_guidance={ea.SCALARS: 0})
acc.Reload()
tb = acc.Scalars("eval/randbin/acc_norm")[-1].value
want = rec["randbin"]["acc_norm"] / rec["randbin"]["examples"]
if abs(tb - want) > 1e-6 or abs(acc.Scalars("eval/bpb")[-1].value - rec["bpb"]) > 1e-6:
    sys.exit(f"TensorBoard eval/randbin/acc_norm {tb}, metrics {want}")
print("metrics.jsonl and TensorBoard:", {k: rec[k] for k in ("randbin", "words", "bpb")})
PY
    expect_rc 0; cat "$out"
    # scripts/plot_metrics.py draws the tasks' fractions among the validation metrics.
    run "$TRAINER_PYTHON" "$src/scripts/plot_metrics.py" "$work/ckpt/metrics.jsonl" -o "$work/plots"
    expect_rc 0; [ -s "$work/plots/eval.png" ] || fail "plot_metrics.py drew no eval.png"
    for np in 1 3; do
      run mpirun -np $np "$trainer" "${evalrun[@]}" "${tasks[@]}" --set checkpoint.dir="$work/ckpt" --evaluate
      expect_rc 0; expect_grep "evaluating checkpoint $work/ckpt/final.safetensors \(4 steps done\)"
      expect_no_grep "continuing at step"; expect_no_grep "step +5/"
      while read -r line; do
        expect_grep "eval step 4: ${line/, acc_norm/ \(.*\), acc_norm}"
      done <"$work/expected.txt"
      expect_grep "eval step 4: loss [0-9.]+ bpb ${bpb:0:5}"
      grep "eval step" "$out"
    done ;;
  eval_tasks_errors)
    # A malformed task file stops every rank before step 1 with exit 2, naming the file and the
    # example; eval.tasks on a model that scores no tokens names the key.
    eval_setup
    pytasks bad "$work/tasks" "$vocab" 32 || fail "hf_tasks.py bad"
    bad() {
      run mpirun -np 2 "$trainer" "${evalrun[@]}" --set eval.tasks="[$work/tasks/$1]"
      expect_rc 2; expect_no_grep "step +1/"; expect_grep "^trainer: error: eval.tasks: $work/tasks/$2"
    }
    bad bad_magic.bin "bad_magic.bin: bad header: magic 20240520, version 1"
    bad big_id.bin "big_id.bin: example 1: ending 1 has id $vocab, at or above the vocabulary \($vocab\)"
    bad bad_label.jsonl "bad_label.jsonl:2: example 1: label 2 is out of range for 2 endings"
    bad too_long.jsonl "too_long.jsonl:1: example 0: the context \([0-9]+ tokens\) and ending 0 \(1 tokens\) do not fit the model's 32 positions"
    run mpirun -np 2 "$trainer" --config "$src/configs/mlp.yaml" --set train.device=cpu \
      --set eval.tasks="[$work/tasks/bad_label.jsonl]"
    expect_rc 2; expect_grep "^trainer: error: eval.tasks: multiple-choice tasks need a language model \(model.name: gpt or llama\); this config has model.name: mlp" ;;
  eval_tasks_without_data)
    # --evaluate with eval.tasks and no data to validate on (HellaSwag on imported weights): the
    # tasks are scored as transformers scores them on the same weights, and the log says that the
    # validation loss was skipped and why, for a checkpoint (data.path gone, 2 ranks) and for
    # model.init_from's Hugging Face weights (data.path not set, 1 rank). A vocabulary the weights
    # do not have stops the run naming data.vocab_size; training still needs its data.
    eval_setup
    pytasks tasks "$work/tasks" "$tok" 7 --seed 5 || fail "hf_tasks.py tasks"
    tasks=(--set eval.tasks="[$work/tasks/randbin.bin,$work/tasks/words.jsonl]")
    run mpirun -np 2 "$trainer" "${evalrun[@]}" --set train.steps=4 --set checkpoint.dir="$work/ckpt"
    expect_rc 0
    run "$trainer" "${evalrun[@]}" --set checkpoint.dir="$work/ckpt" --export-hf "$work/hf"
    expect_rc 0
    pytasks score "$work/hf" "$tok" "$work/shards/val_000000.bin" 16 "$work/tasks/randbin.bin" \
      "$work/tasks/words.jsonl" >"$work/reference.txt" || fail "hf_tasks.py score: $(cat "$work/reference.txt")"
    grep -v "^bpb " "$work/reference.txt" | tee "$work/expected.txt"
    expect_tasks() {  # the task lines of step $1 equal transformers' counts; no validation loss
      expect_rc 0
      while read -r line; do
        expect_grep "eval step $1: ${line/, acc_norm/ \(.*\), acc_norm}"
      done <"$work/expected.txt"
      expect_no_grep "eval step [0-9]+: loss|validation samples|step +1/"
      grep "eval step\|skipped" "$out"
    }
    run mpirun -np 2 "$trainer" "${evalrun[@]}" "${tasks[@]}" --set checkpoint.dir="$work/ckpt" \
      --set data.path="$work/gone" --evaluate
    expect_grep "validation loss skipped: data.path '$work/gone' does not exist \(--evaluate scores eval.tasks without data\)"
    expect_grep "evaluating checkpoint $work/ckpt/final.safetensors \(4 steps done\)"
    expect_tasks 4
    run "$trainer" "${evalrun[@]}" "${tasks[@]}" --set model.init_from="$work/hf" --set data.path= --evaluate
    expect_grep "validation loss skipped: data.path is not set"
    expect_grep "evaluating model.init_from $work/hf"
    expect_tasks 0
    # The weights' vocabulary is the model's: data.vocab_size says otherwise.
    run mpirun -np 2 "$trainer" "${evalrun[@]}" "${tasks[@]}" --set model.init_from="$work/hf" \
      --set data.path= --set data.vocab_size=2000 --evaluate
    expect_rc 2; expect_grep "^trainer: error: .*data.vocab_size = 2000"; grep "^trainer: error" "$out"
    run mpirun -np 2 "$trainer" "${evalrun[@]}" "${tasks[@]}" --set checkpoint.dir="$work/ckpt" \
      --set data.path= --set data.vocab_size=2000 --evaluate
    expect_rc 2
    expect_grep "^trainer: error: checkpoint.dir: .*without data the model is built for data.vocab_size = 2000 token ids"
    grep "^trainer: error" "$out"
    # Training (and --evaluate without eval.tasks) needs data.path as before.
    run mpirun -np 2 "$trainer" "${evalrun[@]}" "${tasks[@]}" --set data.path="$work/gone" --set train.steps=2
    expect_rc 2; expect_grep "^trainer: error: .*$work/gone"; expect_no_grep "skipped"
    grep "^trainer: error" "$out" ;;
  *) echo "unknown case $case_name"; exit 2 ;;
esac
echo "PASS [$case_name]"
