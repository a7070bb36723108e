#!/usr/bin/env bash
# End-to-end checks of the trainer binary, as a user runs it.
#   e2e.sh CASE TRAINER SOURCE_DIR
# Each case prints what it ran and why it failed; exit 0 means the case passed.
set -uo pipefail
case_name=$1 trainer=$2 src=$3
work=$(mktemp -d)
mounted=()  # tmpfs mounts of this case (mount_tmpfs): unmounted before $work goes, however it ends
cleanup() {
  local m
  for m in "${mounted[@]}"; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
source "$src/tests/case_lib.sh"

# mount_tmpfs DIR SIZE: a small file system of its own at DIR (a tmpfs of SIZE bytes), to fill
# up; unmounted when the case ends. Where mounting is impossible (not root, no CAP_SYS_ADMIN in a
# container), the case is skipped (exit 77, ctest's SKIP_RETURN_CODE) and says why.
mount_tmpfs() {
  mkdir -p "$1"
  if ! mount -t tmpfs -o "size=$2" tmpfs "$1" 2>"$work/mount.err"; then
    echo "SKIP [$case_name]: cannot mount a tmpfs at $1 (needs root with CAP_SYS_ADMIN): $(cat "$work/mount.err")"
    exit 77
  fi
  mounted+=("$1")
}
# whole_records FILE FIRST [LAST]: every line of the JSON Lines FILE is a whole JSON object ending
# in a newline (none cut short), and the step records are steps FIRST..LAST (without LAST: FIRST
# to the last one there), each once.
whole_records() {
  "$TRAINER_PYTHON" - "$@" <<'PY' || fail "$1 is damaged or holds the wrong steps"
import json, sys
path, first = sys.argv[1], int(sys.argv[2])
data = open(path, "rb").read()
if data and not data.endswith(b"\n"):
    sys.exit(f"{path}: the last line is cut short: {data.splitlines()[-1][:80]!r}")
steps = [json.loads(line)["step"] for line in data.splitlines() if json.loads(line)["type"] == "step"]
last = int(sys.argv[3]) if len(sys.argv) > 3 else (steps or [first - 1])[-1]
if steps != list(range(first, last + 1)):
    sys.exit(f"{path}: step records {steps}, expected {first}..{last}")
print(f"{path}: {len(data.splitlines())} whole records, steps {first}..{last} once each")
PY
}

# loss_drops: the 'done:' line's last loss is below half the first.
loss_drops() {
  local line first last
  line=$(grep -E "done: [0-9]+ steps, loss" "$out" | tail -1) || fail "no 'done:' line"
  first=$(sed -E 's/.*loss ([0-9.]+) -> ([0-9.]+).*/\1/' <<<"$line")
  last=$(sed -E 's/.*loss ([0-9.]+) -> ([0-9.]+).*/\2/' <<<"$line")
  awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < 0.5 * f) }' || fail "loss did not drop: $first -> $last"
  echo "loss $first -> $last"
}

# same_tensors A B TOL: checkpoints A and B hold the same tensors (parameters and AdamW moments),
# each within a relative error (||a - b|| / ||b||) of TOL; TOL 0 asks for bitwise equality.
same_tensors() {
  "$TRAINER_PYTHON" - "$@" <<'PY' || fail "the checkpoints' tensors differ: $1 vs $2"
import sys
from safetensors.torch import load_file
a, b, tol = load_file(sys.argv[1]), load_file(sys.argv[2]), float(sys.argv[3])
if a.keys() != b.keys():
    sys.exit(f"different tensors: {sorted(a.keys() ^ b.keys())}")
worst, name = 0.0, ""
for k in sorted(a):
    x, y = a[k].double(), b[k].double()
    if x.shape != y.shape:
        sys.exit(f"{k}: shape {tuple(x.shape)} vs {tuple(y.shape)}")
    err = 0.0 if x.equal(y) else float((x - y).norm() / y.norm().clamp_min(1e-30))
    if err >= worst:
        worst, name = err, k
    if (tol == 0 and err != 0) or err > tol:
        sys.exit(f"{k}: relative error {err:.3e} (allowed {tol:g})")
print(f"{len(a)} tensors {'bitwise equal' if worst == 0 else f'within {tol:g}'}: worst {worst:.3e} ({name})")
PY
}

# The pid of rank $2 among mpirun $1's children: this job's ranks only (other tests may run
# trainers at the same time).
rank_pid() {
  local p
  for p in $(pgrep -P "$1"); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" && { echo "$p"; return; }
  done
}
# Waits up to 10 s for each of the processes "$@" to end (a zombie has ended); fails (1) if one
# still runs.
all_end_within_10s() {
  local p _
  for p in "$@"; do
    for _ in $(seq 100); do
      { ! kill -0 "$p" 2>/dev/null || [ "$(awk '{ print $3 }' "/proc/$p/stat" 2>/dev/null)" = Z ]; } && break
      sleep 0.1
    done
    { ! kill -0 "$p" 2>/dev/null || [ "$(awk '{ print $3 }' "/proc/$p/stat" 2>/dev/null)" = Z ]; } || return 1
  done
}
# Waits up to 60 s for process $1 to end; fails (1) if it still runs.
ends_within_60s() {
  local _
  for _ in $(seq 600); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
  return 1
}

quick=(--config "$src/configs/mlp.yaml" --set train.steps=150 --set log.every=25)
bad=$work/bad.yaml
cat >"$bad" <<'YAML'
model:
  name: mlp
train:
  global_batch_size: lots
YAML

# The preference sample tokenized with the sample chat tokenizer (at most 64 tokens a sequence:
# 19 training pairs, 3 validation) and a tiny Llama trained on it with train.objective: dpo, every
# weight (the reference precomputed), 6 pairs a step in micro-batches of 2.
dpo_setup() {
  tok=$src/data/chat-sample/tokenizer/tokenizer.json
  "$TRAINER_PYTHON" "$src/scripts/tokenize_text.py" --preference --tokenizer "$tok" --max-tokens 64 \
    "$src/data/preference-sample/pairs.jsonl" "$work/pairs" >/dev/null || fail "tokenize_text.py --preference"
  dpo=(--config "$src/configs/llama-tiny.yaml" --set data.path="$work/pairs" --set data.vocab_size=2048
    --set data.context=64 --set data.tokenizer="$tok" --set model.num_layers=2 --set model.d_model=32
    --set model.heads=4 --set model.kv_heads=2 --set model.intermediate_size=48
    --set train.device=cpu --set train.objective=dpo --set train.global_batch_size=6
    --set train.micro_batch_size=2 --set train.steps=6 --set train.warmup_steps=0
    --set train.lr=0.001 --set train.eval_every=3 --set train.sample_every=0 --set log.every=1
    --set checkpoint.every=3 --set checkpoint.format=single)
}

# One case per label, each on a line of its own as "  name)": tests/CMakeLists.txt reads the ctest
# list from these labels (trainer_script_cases).
case $case_name in
  version_names_gpu_build)
    # --version says whether this build has the GPU path, as its CMake cache records it: CUDA's
    # and NCCL's versions where both NCCL entries were found (cmake/TrainerDeps.cmake), else
    # "CPU only".
    run "$trainer" --version
    expect_rc 0
    cache=$(dirname "$trainer")/CMakeCache.txt
    if grep -qE '^NCCL_INCLUDE_DIR:PATH=/' "$cache" && grep -qE '^NCCL_LIBRARY:FILEPATH=/' "$cache"; then
      expect_grep "^trainer [0-9.]+ \(LibTorch [0-9.]+; CUDA [0-9]+\.[0-9]+, NCCL [0-9]+\.[0-9]+\.[0-9]+( \(loaded: [0-9.]+\))?\)$"
    else
      expect_grep "^trainer [0-9.]+ \(LibTorch [0-9.]+; CPU only\)$"
    fi
    cat "$out" ;;
  quickstart_np1)
    # configs/quickstart.yaml as it ships, from a directory like the clone's (its data.path and
    # checkpoint.dir are relative), 100 of its 600 steps on one process, sampled and evaluated at
    # the end (its 200-step period shortened: quickstart_np2 runs the whole schedule); then
    # --generate from its checkpoint, as scripts/quickstart.sh does.
    if ! { ln -s "$src/data" "$work/data" && cd "$work"; }; then fail "cannot set up $work"; fi
    run "$trainer" --config "$src/configs/quickstart.yaml" --set train.steps=100 \
      --set train.sample_every=100 --set train.eval_every=100
    expect_rc 0; expect_grep "1 rank\(s\)"; expect_grep "sample at step 100: The parser"
    expect_grep "eval step 100: loss"; loss_drops
    if ! [[ -f runs/quickstart/final.safetensors && -f runs/quickstart/metrics.jsonl ]]; then
      fail "no runs/quickstart/final.safetensors or metrics.jsonl: $(ls -R runs)"
    fi
    run "$trainer" --config "$src/configs/quickstart.yaml" --generate "The parser" --max-new-tokens 20
    expect_rc 0; expect_grep "^The parser" ;;
  quickstart_np2)
    # The quick start's training run itself (scripts/quickstart.sh, README section 1): all 600
    # steps on 2 ranks; the loss ends below 2 (the README says about 1.6).
    if ! { ln -s "$src/data" "$work/data" && cd "$work"; }; then fail "cannot set up $work"; fi
    run mpirun -np 2 "$trainer" --config "$src/configs/quickstart.yaml"
    expect_rc 0; expect_grep "\[0/2\]"; expect_grep "2 rank\(s\)"; loss_drops
    expect_grep "sample at step 600: The parser"; expect_grep "eval step 600: loss"
    expect_grep "done: 600 steps, loss [0-9.]+ -> 1\.[0-9]+,"
    [ -f runs/quickstart/final.safetensors ] || fail "no runs/quickstart/final.safetensors" ;;
  quickstart_parameters_np2)
    # The quick start switched to ZeRO-3 (ddp.shard: parameters), 200 of its 600 steps (its
    # periods halved): it runs to the end with its samples (rank 0's generation, every rank
    # gathering the units with it) and its evaluations (every rank's slice, the units gathered in
    # step). quickstart_np2 runs the whole schedule.
    if ! { ln -s "$src/data" "$work/data" && cd "$work"; }; then fail "cannot set up $work"; fi
    run mpirun -np 2 "$trainer" --config "$src/configs/quickstart.yaml" --set ddp.shard=parameters \
      --set train.steps=200 --set train.sample_every=100 --set train.eval_every=100
    expect_rc 0; expect_grep "memory plan \(rank 0, ddp.shard: parameters\)"
    expect_grep "sample at step 100: The parser"; expect_grep "sample at step 200: The parser"
    expect_grep "eval step 100: loss"; expect_grep "eval step 200: loss"; loss_drops
    [ -d runs/quickstart/final ] || fail "no sharded runs/quickstart/final: $(ls runs/quickstart)" ;;
  plan_without_gpu)
    # The planning flags as a new user tries them on a login node (no GPU, no data): each plan
    # comes from the model's shapes (no probe, no weights), says so, and names the largest model
    # of the family that fits per mode; configs/gpt2.yaml as shipped (ddp.backend: nccl,
    # data.path absent) is accepted. Time and memory: bench/RESULTS.md (/usr/bin/time -v).
    plan=(--dry-run --plan-ranks 8 --plan-device-memory 80GiB)
    for preset in smollm-135m llama-3.2-1b; do
      run timeout 120 "$trainer" --config "$src/configs/llama-tiny.yaml" --set model.preset=$preset \
        --set data.context=2048 --set train.global_batch_size=64 --set train.device=cuda "${plan[@]}"
      expect_rc 0; expect_grep "activations computed from the shapes"
      expect_grep "micro_batch_size auto would pick [0-9]+ under ddp.shard: none"
      expect_grep "largest llama of this shape ratio that fits under ddp.shard: parameters \(micro-batch 1\): [0-9.]+B parameters"
    done
    run timeout 120 "$trainer" --config "$src/configs/gpt2.yaml" "${plan[@]}"
    expect_rc 0; expect_grep "model: gpt 0.12B parameters"; expect_grep "dry run: nothing trained"
    expect_no_grep "error"
    # A preset's shape (untied, as Llama 3.1 70B's config.json): with fp32 masters and AdamW's
    # moments (16 bytes per parameter) it fits no mode at 8 x 80 GB, and under parameters alone
    # at 32 ranks.
    big=(--config "$src/configs/llama-tiny.yaml" --set model.preset=llama-3.1-70b
      --set model.tie_embeddings=false --set data.vocab_size=128256 --set data.context=4096
      --set train.global_batch_size=32 --set train.micro_batch_size=1 --set train.precision=bf16
      --set model.checkpoint_activations=true --set ddp.shard=parameters --set train.device=cuda
      --dry-run --plan-device-memory 80GiB)
    run timeout 120 "$trainer" "${big[@]}" --plan-ranks 8
    expect_rc 0; expect_grep "model: llama 70.55B parameters"
    expect_grep "does not fit under ddp.shard: parameters; no ddp.shard mode fits, even with every lever"
    expect_grep "nothing fits even with every lever: ddp.shard: parameters with activation checkpointing at micro-batch 1 needs [0-9.]+ MiB of the [0-9.]+ MiB budget"
    run timeout 120 "$trainer" "${big[@]}" --plan-ranks 32
    expect_rc 0; expect_grep "train.micro_batch_size = 1 fits under ddp.shard: parameters"
    expect_grep "gradients .* none fits" ;;
  plan_what_fits)
    # Llama 3.1 8B at 8192 positions on 8 x 80 GiB (bf16, micro-batch auto) fits no ddp.shard
    # mode as configured: the plan names what would (each mode, its micro-batch, the fallback
    # rungs it pulls), and the settings it prints, added to the command line, make a plan that
    # fits. Each plan takes seconds (bench/plan_presets.sh).
    llama8b=(--config "$src/configs/llama-tiny.yaml" --set model.preset=llama-3.1-8b
      --set data.vocab_size=128256 --set data.context=8192 --set train.global_batch_size=64
      --set train.precision=bf16 --set train.device=cuda
      --dry-run --plan-ranks 8 --plan-device-memory 80GiB)
    run timeout 60 "$trainer" "${llama8b[@]}"
    expect_rc 0
    expect_grep "micro_batch_size auto: not even 1 sample fits under ddp.shard: none; no ddp.shard mode fits as configured"
    expect_grep "what fits: ddp.shard: gradients at micro-batch 4 \(auto's pick\) with activation checkpointing \(memory.fallback's rung checkpoint_activations, taken before the run\); add to the command line: --set ddp.shard=gradients --set model.checkpoint_activations=true$"
    expect_grep "what fits: ddp.shard: parameters at micro-batch 8 \(auto's pick\) with activation checkpointing \(memory.fallback's rungs shard_parameters, checkpoint_activations, taken before the run\); add to the command line: --set ddp.shard=parameters --set model.checkpoint_activations=true$"
    expect_no_grep "what fits: ddp.shard: (none|optimizer)"
    read -ra settings <<<"$(grep -oE "what fits: ddp.shard: parameters .*add to the command line: .*" "$out" | sed 's/.*add to the command line: //')"
    run timeout 60 "$trainer" "${llama8b[@]}" "${settings[@]}"
    expect_rc 0; expect_grep "micro_batch_size auto would pick 8 under ddp.shard: parameters$"
    expect_no_grep "what fits" ;;
  cpu_budget_auto_rung_np2)
    # No memory.cpu_budget_mb set: its default (auto: the memory available at start, 90% of it
    # shared among the node's ranks, less 256 MiB each) makes a micro-batch that does not fit the
    # machine take a fallback rung instead of meeting the kernel's OOM killer. The machine's
    # available memory is stated as 1200 MiB (TRAINER_TEST_AVAILABLE_MB, read in place of
    # /proc/meminfo's MemAvailable), so 284 MiB per rank; 64 samples of 256 tokens need more.
    run timeout 300 env TRAINER_TEST_AVAILABLE_MB=1200 mpirun -np 2 "$trainer" \
      --config "$src/configs/gpt-tiny.yaml" --set "data.path=$src/data/tokens-sample" \
      --set train.device=cpu --set train.steps=2 --set train.warmup_steps=1 --set data.context=256 \
      --set model.context=256 --set model.d_model=128 --set model.heads=4 \
      --set train.global_batch_size=128 --set train.micro_batch_size=64 \
      --set "memory.fallback=[halve_micro_batch]" --set train.eval_every=0
    expect_rc 0
    expect_grep "step 1: out of memory on [12] rank\(s\): .*CPU out of memory.*Fallback halve_micro_batch: micro-batch 64 -> 32"
    expect_grep "done: 2 steps, .* [1-9] memory fallback\(s\)" ;;
  mlp_np1)
    run "$trainer" "${quick[@]}"
    expect_rc 0; expect_grep "step +150/150"; expect_grep "samples/s"; loss_drops ;;
  mlp_np2)
    run mpirun -np 2 "$trainer" "${quick[@]}"
    expect_rc 0; expect_grep "\[0/2\]"; expect_grep "2 rank\(s\)"; loss_drops
    expect_no_grep "spike guard" ;;  # train.skip_spikes is off: the banner says nothing of it
  bad_config_np2)
    start=$(date +%s)
    run timeout 10 mpirun -np 2 "$trainer" --config "$bad"
    expect_rc 2
    expect_grep "bad.yaml:4: train.global_batch_size: expected an integer, got 'lots'"
    [ "$(grep -c "train.global_batch_size" "$out")" = 1 ] || fail "the message is not printed exactly once"
    echo "exited $rc after $(( $(date +%s) - start )) s" ;;
  bad_config_rank1_only)
    # Only rank 1 sees a broken file: rank 0 must not be left waiting, and rank 1 says why.
    good=$work/good.yaml; cp "$src/configs/mlp.yaml" "$good"
    cat >"$work/pick.sh" <<SH
#!/usr/bin/env bash
if [ "\$OMPI_COMM_WORLD_RANK" = 1 ]; then exec "$trainer" --config "$bad"; else exec "$trainer" --config "$good"; fi
SH
    chmod +x "$work/pick.sh"
    run timeout 10 mpirun -np 2 "$work/pick.sh"
    expect_rc 2; expect_grep "error on rank 1: .*bad.yaml:4: train.global_batch_size" ;;
  unknown_key_suggests)
    run "$trainer" "${quick[@]}" --set train.global_bach_size=8
    expect_rc 2; expect_grep "unknown key 'train.global_bach_size' \(did you mean 'train.global_batch_size'\?\)" ;;
  missing_config_file)
    run "$trainer" --config "$work/nope.yaml"
    expect_rc 2; expect_grep "nope.yaml"; expect_no_grep "terminate called|Aborted" ;;
  bad_cli)
    run "$trainer" --config "$src/configs/mlp.yaml" --frobnicate
    expect_rc 2; expect_grep "frobnicate" ;;
  world_larger_than_batch)
    run timeout 20 mpirun -np 3 "$trainer" "${quick[@]}" --set train.global_batch_size=2
    expect_rc 2; expect_grep "smaller than the world size 3" ;;
  cuda_without_gpu)
    run "$trainer" "${quick[@]}" --set train.device=cuda
    expect_rc 2; expect_grep "train.device is 'cuda' but this process sees no CUDA device"
    # Set but empty hides every GPU: said so, not called unset.
    run env CUDA_VISIBLE_DEVICES= "$trainer" "${quick[@]}" --set train.device=cuda
    expect_rc 2; expect_grep "CUDA_VISIBLE_DEVICES is set but empty: no GPU is visible" ;;
  srun_without_pmix)
    # What srun without --mpi=pmix looks like from inside (no PMIX_RANK): stopped before MPI_Init.
    # The real thing runs in the slurm tests.
    run env SLURM_PROCID=0 SLURM_STEP_ID=0 SLURM_NTASKS=3 SLURM_LOCALID=0 "$trainer" "${quick[@]}"
    expect_rc 2; expect_grep "trainer: error: started by srun without --mpi=pmix \(SLURM_PROCID=0\)"
    expect_grep "--mpi=pmix"; expect_no_grep "MPI_Init" ;;
  dry_run)
    run mpirun -np 3 "$trainer" "${quick[@]}" --dry-run --set train.global_batch_size=100 --set train.micro_batch_size=16
    expect_rc 0
    expect_grep "rank +0 .*batch 34 samples \[0, 34\) in 3 micro-batch\(es\) of 16 \(last 2\)"
    expect_grep "rank +2 .*batch 33 samples \[67, 100\)"
    expect_grep "memory plan \(rank 0, ddp.shard: none\): parameters"
    expect_grep "per-rank state by ddp.shard \(parameters / gradients / optimizer state\): none [0-9.]+ / [0-9.]+ / [0-9.]+ = [0-9.]+ MiB; optimizer .*; gradients [0-9.]+ / [0-9.]+ / [0-9.]+ = [0-9.]+ MiB; parameters [0-9.]+ / [0-9.]+ / [0-9.]+ = [0-9.]+ MiB"
    expect_grep "dry run: nothing trained"; expect_no_grep "step +1/" ;;
  dry_run_plan_cuda)
    # A CUDA config planned on this machine (no GPU) for 64 ranks of 80 GiB: every ddp.shard
    # mode's per-rank state and auto's micro-batch; a language model's activations computed from
    # its shapes, another model's (mlp) probed on the CPU at bf16.
    if ! { ln -s "$src/data" "$work/data" && cd "$work"; }; then fail "cannot set up $work"; fi
    run "$trainer" --config "$src/configs/quickstart.yaml" --set train.device=cuda \
      --set train.precision=bf16 --set train.global_batch_size=200 \
      --dry-run --plan-ranks 64 --plan-device-memory 80GiB
    expect_rc 0; expect_no_grep "sees no CUDA device"
    expect_grep "plan for 64 rank\(s\) of 81920.0 MiB device memory: budget [0-9.]+ MiB"
    expect_grep "activations \(computed from the shapes: estimate of CUDA memory, at the config's precision\): [0-9.]+ MiB fixed \+ [0-9.]+ MiB/sample"
    for mode in none optimizer gradients; do
      expect_grep "$mode +[0-9.]+ MiB +[0-9.]+ MiB +[0-9.]+ MiB +[0-9.]+ MiB  [0-9]+"
    done
    expect_grep "none .*  \(in force\)"
    expect_grep "global batch 200 at 64 rank\(s\): rank 0 takes 4 samples \[0, 4\) in 1 micro-batch\(es\) of 4"
    expect_grep "micro_batch_size auto would pick 4 under ddp.shard: none"
    expect_grep "dry run: nothing trained"
    run "$trainer" --config "$src/configs/mlp.yaml" --set train.device=cuda \
      --set train.precision=bf16 --dry-run --plan-ranks 8 --plan-device-memory 80GiB
    expect_rc 0
    expect_grep "activations \(CPU-measured estimate of CUDA memory, at the config's precision\): [0-9.]+ MiB fixed \+ [0-9.]+ MiB/sample"
    expect_grep "dry run: nothing trained" ;;
  dry_run_plan_errors)
    # Each mistake is exit 2 with a message naming the flag or key, before any training.
    run "$trainer" "${quick[@]}" --dry-run --plan-ranks 0 --plan-device-memory 80GiB
    expect_rc 2; expect_grep "--plan-ranks"
    run "$trainer" "${quick[@]}" --dry-run --plan-ranks 8 --plan-device-memory 80gigs
    expect_rc 2; expect_grep "--plan-device-memory '80gigs' is not a memory size"
    run "$trainer" "${quick[@]}" --plan-ranks 8 --plan-device-memory 80GiB
    expect_rc 2; expect_grep "--plan-ranks requires --dry-run"
    run "$trainer" "${quick[@]}" --dry-run --plan-ranks 8
    expect_rc 2; expect_grep "--plan-ranks requires --plan-device-memory"
    run "$trainer" "${quick[@]}" --set train.global_batch_size=32 --dry-run --plan-ranks 64 --plan-device-memory 80GB
    expect_rc 2; expect_grep "--plan-ranks 64 is more than train.global_batch_size = 32"
    run mpirun -np 2 "$trainer" "${quick[@]}" --dry-run --plan-ranks 8 --plan-device-memory 80GB
    expect_rc 2; expect_grep "run it without mpirun"
    run "$trainer" "${quick[@]}" --dry-run --plan-ranks 8 --plan-ranks-per-node 3 --plan-device-memory 80GB
    expect_rc 2; expect_grep "--plan-ranks-per-node 3 does not divide --plan-ranks 8"
    expect_no_grep "dry run: nothing trained"
    run "$trainer" "${quick[@]}" --dry-run --plan-ranks 8 --plan-ranks-per-node 0 --plan-device-memory 80GB
    expect_rc 2; expect_grep "--plan-ranks-per-node"
    run "$trainer" "${quick[@]}" --dry-run --plan-ranks-per-node 4
    expect_rc 2; expect_grep "--plan-ranks-per-node requires --plan-ranks"
    run "$trainer" "${quick[@]}" --set ddp.shard=gradients --set ddp.shard_group=node \
      --dry-run --plan-ranks 8 --plan-device-memory 80GB
    expect_rc 2; expect_grep "ddp.shard_group is node: .* needs --plan-ranks-per-node M"
    expect_no_grep "dry run: nothing trained" ;;
  dry_run_plan_hybrid)
    # ddp.shard_group: node planned for 8 ranks, 4 per node: the moments per rank under
    # ddp.shard: optimizer are twice those of the same 8 ranks sharded over the world (an MLP of
    # 8.5M parameters, so that the MiB figures show it).
    plan=(--set model.hidden_dim=2048 --set ddp.shard=optimizer --dry-run --plan-ranks 8
      --plan-device-memory 80GB)
    run "$trainer" "${quick[@]}" "${plan[@]}" --set ddp.shard_group=node --plan-ranks-per-node 4
    expect_rc 0
    expect_grep "ddp.shard_group: node: a shard spans the 4 rank\(s\) of one node \(--plan-ranks-per-node\) and is replicated on each of the 2 node\(s\)"
    node=$(grep -oE "optimizer +[0-9.]+ MiB +[0-9.]+ MiB +[0-9.]+ MiB" "$out" | awk '{print $6}')
    run "$trainer" "${quick[@]}" "${plan[@]}"
    expect_rc 0; expect_grep "ddp.shard_group: world: a shard spans all 8 rank\(s\)"
    world=$(grep -oE "optimizer +[0-9.]+ MiB +[0-9.]+ MiB +[0-9.]+ MiB" "$out" | awk '{print $6}')
    echo "optimizer state per rank under ddp.shard: optimizer: node $node MiB, world $world MiB"
    awk -v n="$node" -v w="$world" 'BEGIN { exit !(w > 0 && n / w > 1.9 && n / w < 2.1) }' ||
      fail "4 ranks per node should keep twice the moments of 8 ranks over the world" ;;
  print_config_roundtrip)
    # The printed configuration, fed back in, prints the same text: every value survives the
    # round trip, the --set ones (a float, an integer, a list, a choice) included.
    run "$trainer" "${quick[@]}" --print-config --set train.lr=0.0123456789 --set ddp.timeout_s=33 \
      --set "memory.fallback=[halve_micro_batch]" --set train.precision=bf16
    expect_rc 0; expect_grep "^  lr: 0.0123456789$"; expect_grep "^  timeout_s: 33$"
    expect_grep "^  fallback: \[halve_micro_batch\]$"; expect_grep "^  precision: bf16$"
    cp "$out" "$work/printed.yaml"
    run "$trainer" --config "$work/printed.yaml" --print-config
    expect_rc 0
    diff "$work/printed.yaml" "$out" || fail "the second print differs from the first (above)"
    echo "$(wc -l <"$out") lines printed the same twice"
    run "$trainer" --config "$work/printed.yaml" --dry-run
    expect_rc 0 ;;
  help_config)
    run "$trainer" --help-config
    expect_rc 0; expect_grep "^train.global_batch_size +integer +required"; expect_grep "^ddp.timeout_s" ;;
  checkpoint_and_signal)
    # SIGINT mid-run: the step finishes, the ranks agree, a checkpoint is written, exit 130.
    echo "+ $trainer ${quick[*]} --set train.steps=1000000 (then SIGINT)"
    "$trainer" "${quick[@]}" --set train.steps=1000000 --set checkpoint.dir="$work/ckpt" >"$out" 2>&1 &
    pid=$!
    for _ in $(seq 200); do grep -q "step " "$out" && break; sleep 0.1; done
    kill -INT $pid
    wait $pid; rc=$?
    expect_rc 130
    [ -f "$work/ckpt/final.safetensors" ] || fail "no checkpoint at $work/ckpt/final.safetensors"
    expect_grep "stop requested \(signal\)" ;;
  usr1_to_one_rank_np2)
    # The preemption warning reaches rank 1 only (srun passes a signal on to the tasks one by one;
    # here rank 0 never gets it): the ranks stop together at rank 1's request, rank 0 still says
    # why, and both end with 138, the code slurm/train.sbatch requeues on (rank 0 ended with 128
    # before the signal was agreed over the ranks). The requeued run resumes from the checkpoint.
    echo "+ mpirun -np 2 $trainer ${quick[*]} --set checkpoint.resume=auto (then SIGUSR1 to rank 1)"
    mpirun -np 2 "$trainer" "${quick[@]}" --set train.steps=100000000 --set train.warmup_steps=0 \
      --set checkpoint.dir="$work/ckpt" --set checkpoint.resume=auto >"$out" 2>&1 &
    mpirun_pid=$!
    for _ in $(seq 300); do grep -qE "step +[0-9]+/" "$out" && break; sleep 0.1; done
    victim=$(rank_pid $mpirun_pid 1)
    [ -n "$victim" ] || fail "could not find rank 1's process"
    kill -USR1 "$victim"
    wait $mpirun_pid; rc=$?
    expect_rc 138
    expect_grep "SIGUSR1: preemption warning \(it reached other ranks first\): stopped after step [0-9]+ with a checkpoint in $work/ckpt \(exit code 138\)"
    expect_no_grep "exited with status 128|exit code 128"
    [ -f "$work/ckpt/final.safetensors" ] || fail "no checkpoint at $work/ckpt/final.safetensors"
    at=$(grep -oE "stopped after step [0-9]+" "$out" | grep -oE "[0-9]+$")
    run mpirun -np 2 "$trainer" "${quick[@]}" --set train.steps=$((at + 10)) --set train.warmup_steps=0 \
      --set checkpoint.dir="$work/ckpt" --set checkpoint.resume=auto
    expect_rc 0
    expect_grep "resumed from $work/ckpt/final.safetensors: $at steps done" ;;
  stalled_rank_times_out)
    # Rank 1 is frozen with SIGSTOP mid-training: the others must end the job, with a message
    # naming the operation and step, within 30 s (ddp.timeout_s: 10), instead of hanging. Their
    # desync exchange (5 s) gets no answer from rank 1, and the message names it.
    echo "+ mpirun -np 3 $trainer ${quick[*]} --set ddp.timeout_s=10 (then SIGSTOP rank 1)"
    mpirun -np 3 "$trainer" "${quick[@]}" --set train.steps=100000000 --set ddp.timeout_s=10 >"$out" 2>&1 &
    mpirun_pid=$!
    for _ in $(seq 300); do grep -q "step " "$out" && break; sleep 0.1; done
    victim=$(rank_pid $mpirun_pid 1)
    [ -n "$victim" ] || fail "could not find rank 1's process"
    kill -STOP "$victim"
    stopped_at=$(date +%s)
    if ! ends_within_60s $mpirun_pid; then
      kill -CONT "$victim"; kill -KILL $mpirun_pid; fail "the job still runs 60 s after rank 1 stopped"
    fi
    wait $mpirun_pid; rc=$?
    took=$(( $(date +%s) - stopped_at ))
    echo "job ended $took s after SIGSTOP with exit code $rc"
    [ "$rc" != 0 ] || fail "exit code 0 after a stalled rank"
    [ "$took" -le 30 ] || fail "took $took s (> 30 s)"
    expect_grep "did not complete at step [0-9]+: waited [0-9]+\.[0-9] s, past ddp.timeout_s = 10 s"
    expect_grep "desync check, answers from rank\(s\) 0, 2 of 3 within 5 s"
    expect_grep "rank 1 did not reach the [a-z_()]+ of .* at step [0-9]+, or is stuck in it: no answer within 5 s"
    grep -E "rank 1 did not reach" "$out" | head -1
    expect_grep "aborting the job" ;;
  oom_fallback_np3)
    # An OOM injected on rank 1 at step 5 in backward: the job falls back and finishes.
    run mpirun -np 3 "$trainer" "${quick[@]}" --set train.steps=30 --set memory.inject_oom=1:5:backward
    expect_rc 0
    expect_grep "\[0/3\] \[warning\] step 5: out of memory on 1 rank\(s\): rank 1 in backward .*Fallback halve_micro_batch: micro-batch 171 -> 85"
    [ "$(grep -c "out of memory on" "$out")" = 1 ] || fail "the fallback is not logged exactly once"
    expect_grep "done: 30 steps, .* 1 memory fallback\(s\)" ;;
  oom_past_last_rung_np2)
    # Every attempt fails: every rank exits 4 with one message naming rank, step and bytes.
    run timeout 30 mpirun -np 2 "$trainer" "${quick[@]}" --set memory.inject_oom=1:3:forward:always \
      --set memory.min_micro_batch=64 --set checkpoint.dir="$work/ckpt"
    expect_rc 4
    expect_grep "trainer: error: out of memory at step 3 with every fallback spent"
    expect_grep "rank 1 in forward \(micro-batch 64\): CPU out of memory: tried to allocate [0-9]+ bytes; injected by memory.inject_oom \(1:3:forward\); [0-9]+ bytes free of the [0-9]+ byte budget"
    expect_grep "checkpoint written to .*/ckpt/oom_step_000003.safetensors"
    expect_grep "Or shard the optimizer state: ddp.shard: optimizer, or the rung shard_optimizer in memory.fallback."
    [ -f "$work/ckpt/oom_step_000003.safetensors" ] || fail "no checkpoint"
    [ "$(grep -c "with every fallback spent" "$out")" = 1 ] || fail "message not printed exactly once" ;;
  oom_in_optimizer_aborts_np3)
    # After the status vote nothing can be retried: an OOM in the (allocation-free) optimizer
    # step of rank 1 ends the whole job with exit 4 and a message naming rank and step.
    start=$(date +%s)
    run timeout 30 mpirun -np 3 "$trainer" "${quick[@]}" --set memory.inject_oom=1:5:optimizer
    expect_rc 4
    expect_grep "rank 1 ran out of memory in the optimizer step of step 5"
    expect_no_grep "step +150/150"
    echo "exited $rc after $(( $(date +%s) - start )) s" ;;
  state_too_big_before_step1_np2)
    # Persistent state that does not fit in any ddp.shard mode is not a fallback case: the plan
    # stops every rank before step 1 (exit 2, a plan error), before allocating it.
    run timeout 30 mpirun -np 2 "$trainer" "${quick[@]}" --set model.hidden_dim=2048 --set memory.cpu_budget_mb=95
    expect_rc 2
    expect_grep "trainer: error: rank [01]: with ddp.shard: none the state kept for the whole run does not fit before step 1: parameters [0-9.]+ MiB, gradients [0-9.]+ MiB, optimizer state [0-9.]+ MiB"
    expect_grep "of the 95.0 MiB this rank plans with \(memory.cpu_budget_mb\); none of the ddp.shard modes fits"
    expect_no_grep "step +1/"
    [ "$(grep -c "does not fit before step 1" "$out")" = 1 ] || fail "message not printed exactly once" ;;
  shard_plan_np2)
    # Replicated state (parameters, gradients, two moments: 4 x 44 MiB, and the 17 MiB data set:
    # 194 MiB) beyond memory.cpu_budget_mb, ddp.shard: optimizer's (3.5 x 44 MiB, 178 MiB at its
    # peak) within it: unsharded, every rank stops before step 1 with exit 2 and one message naming
    # the mode; with the mode named, the same budget trains. (Layers of 4 MiB: backward's
    # transient gradient of one layer fits the room left.)
    big=(--set model.hidden_dim=1024 --set model.depth=12 --set memory.cpu_budget_mb=190
         --set train.steps=10 --set train.warmup_steps=2 --set train.micro_batch_size=16)
    run timeout 60 mpirun -np 2 "$trainer" "${quick[@]}" "${big[@]}"
    expect_rc 2
    expect_grep "with ddp.shard: none the state kept for the whole run does not fit before step 1"
    expect_grep "ddp.shard: optimizer would keep [0-9.]+ MiB per rank, leaving [0-9.]+ MiB for activations: set ddp.shard: optimizer"
    expect_no_grep "step +1/"
    [ "$(grep -c "does not fit before step 1" "$out")" = 1 ] || fail "message not printed exactly once"
    run timeout 120 mpirun -np 2 "$trainer" "${quick[@]}" "${big[@]}" --set ddp.shard=optimizer
    expect_rc 0
    expect_grep "memory plan \(rank 0, ddp.shard: optimizer\)"
    expect_grep "done: 10 steps, .* 0 memory fallback\(s\)" ;;
  whole_build_refused_np2)
    # A language model too large to build whole on a rank (llama-tiny: 3.0M parameters, about
    # 11 MiB in fp32, over memory.cpu_budget_mb = 8) under ddp.shard: gradients: the plan refuses
    # it before it is built (exit 2, naming ddp.shard: parameters, which builds it without
    # storage), instead of the build running out of memory (exit 4).
    run timeout 60 mpirun -np 2 "$trainer" --config "$src/configs/llama-tiny.yaml" \
      --set "data.path=$src/data/tokens-sample" --set train.device=cpu --set ddp.shard=gradients \
      --set memory.cpu_budget_mb=8 --set train.steps=1
    expect_rc 2
    expect_grep "model llama \([0-9.]+ MiB of parameters and buffers\) cannot be built whole on every rank under ddp.shard: gradients: it needs [0-9.]+ MiB of the 8.0 MiB each rank plans with \(memory.cpu_budget_mb\)"
    expect_grep "ddp.shard: parameters builds it without storage and keeps 1/2 of it \([0-9.]+ MiB\) on each rank.*: set ddp.shard: parameters \(--set ddp.shard=parameters\)"
    expect_no_grep "out of memory"
    [ "$(grep -c "cannot be built whole" "$out")" = 1 ] || fail "message not printed exactly once" ;;
  shard_parameters_fits_np4)
    # A 12.7M-parameter gpt of 16 blocks on 4 ranks under memory.cpu_budget_mb = 106: ddp.shard:
    # gradients needs the whole model once plus its flat copy (109 MiB) and stops before step 1
    # (exit 2) naming parameters, which needs the model once plus 16/4 bytes per parameter and
    # one unit (100 MiB) and trains with the same budget.
    big=(--config "$src/configs/gpt-tiny.yaml" --set "data.path=$src/data/tokens-sample"
         --set model.num_layers=16 --set model.d_model=256 --set model.heads=4
         --set data.context=8 --set train.global_batch_size=4 --set train.micro_batch_size=1
         --set train.device=cpu --set train.steps=3 --set train.warmup_steps=1
         --set train.eval_every=0 --set train.eval_samples=8 --set log.every=1
         --set memory.cpu_budget_mb=106)
    run timeout 60 mpirun -np 4 "$trainer" "${big[@]}" --set ddp.shard=gradients
    expect_rc 2
    expect_grep "with ddp.shard: gradients the state kept for the whole run does not fit before step 1"
    expect_grep "ddp.shard: parameters would keep [0-9.]+ MiB per rank, leaving [0-9.]+ MiB for activations: set ddp.shard: parameters"
    expect_no_grep "step +1/"
    run timeout 90 mpirun -np 4 "$trainer" "${big[@]}" --set ddp.shard=parameters
    expect_rc 0
    expect_grep "memory plan \(rank 0, ddp.shard: parameters\)"
    expect_grep "done: 3 steps, .* 0 memory fallback\(s\)" ;;
  oom_in_shard_parameters_step_np2)
    # An out-of-memory error inside a ddp.shard: parameters step takes a rung as in the other
    # modes: rank 1 issues the rest of the step's gathers without computing, both vote, both
    # recompute their blocks from then on, and the run ends (well before ddp.timeout_s); past the
    # last rung, exit 4 on every rank with the reason.
    zero3=(--config "$src/configs/gpt-tiny.yaml" --set "data.path=$src/data/tokens-sample"
      --set train.device=cpu --set train.steps=5 --set train.warmup_steps=1
      --set train.micro_batch_size=8 --set ddp.shard=parameters --set ddp.timeout_s=300)
    run timeout 120 mpirun -np 2 "$trainer" "${zero3[@]}" --set memory.inject_oom=1:3:forward
    expect_rc 0
    expect_grep "step 3: out of memory on 1 rank\(s\): rank 1 in forward .*Fallback checkpoint_activations"
    expect_grep "done: 5 steps, .* 1 memory fallback\(s\)"
    run timeout 120 mpirun -np 2 "$trainer" "${zero3[@]}" --set memory.inject_oom=0:2:backward:always \
      --set "memory.fallback=[halve_micro_batch]" --set memory.min_micro_batch=4
    expect_rc 4
    expect_grep "out of memory at step 2 with every fallback spent"
    expect_no_grep "step +2/" ;;
  oom_shard_optimizer_np2)
    # The rung shard_optimizer, listed first: an OOM on rank 1 at step 5 makes the run sharded
    # (ZeRO-1) on both ranks at the same micro-batch; it finishes, and its checkpoint is the one
    # format, equal to a run sharded from the start.
    rung=(--set train.steps=30 --set train.micro_batch_size=64 --set "memory.fallback=[shard_optimizer,halve_micro_batch]"
      --set checkpoint.format=single)
    run mpirun -np 2 "$trainer" "${quick[@]}" "${rung[@]}" --set memory.inject_oom=1:5:backward \
      --set checkpoint.dir="$work/switched"
    expect_rc 0
    expect_grep "\[0/2\] \[warning\] step 5: out of memory on 1 rank\(s\): rank 1 in backward .*Fallback shard_optimizer: now ddp.shard: optimizer, each rank keeps the AdamW moments of its 1/2 of the parameters .*micro-batch 64 unchanged"
    expect_grep "done: 30 steps, .* 1 memory fallback\(s\)"
    run mpirun -np 2 "$trainer" "${quick[@]}" "${rung[@]}" --set ddp.shard=optimizer \
      --set checkpoint.dir="$work/sharded"
    expect_rc 0
    same_tensors "$work/switched/final.safetensors" "$work/sharded/final.safetensors" 1e-6 ;;
  dpo_resume_np3_on_np2)
    # train.objective: dpo in full fine-tuning (the reference precomputed before step 1 and kept
    # beside the checkpoints) on the preference sample: 6 steps on 3 ranks, or the rest of them on
    # 2 from its step-3 checkpoint, which reads the table back: the same parameters and moments
    # (1e-5: another world size sums in another order), and TRL's metrics in metrics.jsonl.
    dpo_setup
    run mpirun -np 3 "$trainer" "${dpo[@]}" --set checkpoint.dir="$work/whole"
    expect_rc 0
    cp "$out" "$work/whole.log"
    expect_grep "train.objective: dpo: reference the initial weights' log-probabilities, computed once before step 1 \(19 pairs, 3 validation\), kept in $work/whole/reference_logps.safetensors"
    expect_grep "step +6/6 loss [0-9.]+ accuracies [0-9.]+ margins"
    grep -q '"rewards/accuracies"' "$work/whole/metrics.jsonl" || fail "no rewards/accuracies in metrics.jsonl"
    grep '"type":"eval"' "$work/whole/metrics.jsonl" | grep -q '"rewards/margins"' \
      || fail "no validation rewards/margins in metrics.jsonl"
    run mpirun -np 2 "$trainer" "${dpo[@]}" --set checkpoint.resume="$work/whole/step_000003.safetensors" \
      --set checkpoint.dir="$work/resumed"
    expect_rc 0
    expect_grep "reference the initial weights' log-probabilities, computed once before step 1 \(19 pairs, 3 validation\), read from $work/whole/reference_logps.safetensors"
    expect_grep "continuing at step 4"
    same_tensors "$work/resumed/final.safetensors" "$work/whole/final.safetensors" 1e-5
    # The same 6 steps under ddp.shard: gradients, with an OOM at step 2 (the rung
    # checkpoint_activations, the step re-run): the same final loss.
    last=$(grep -oE "done: 6 steps, loss [0-9.]+ -> [0-9.]+" "$work/whole.log" | grep -oE "[0-9.]+$")
    run mpirun -np 2 "$trainer" "${dpo[@]}" --set ddp.shard=gradients --set memory.inject_oom=1:2:backward \
      --set "memory.fallback=[checkpoint_activations]" --set checkpoint.dir="$work/oom"
    expect_rc 0
    expect_grep "Fallback checkpoint_activations"
    expect_grep "done: 6 steps, loss 0.6931 -> $last," ;;
  dpo_errors)
    # train.objective: dpo on chat shards (no .pairs): exit 2 naming the key and the shard; pairs
    # under train.objective: lm; a DPO key's bad value; a resume whose reference is gone.
    dpo_setup
    run "$TRAINER_PYTHON" "$src/scripts/tokenize_text.py" --chat --tokenizer "$tok" \
      "$src/data/chat-sample/chat.jsonl" "$work/chat"
    expect_rc 0
    run "$trainer" "${dpo[@]}" --set data.path="$work/chat"
    expect_rc 2
    expect_grep "$work/chat/train_000000.bin: train.objective: dpo trains on preference pairs, but there is no $work/chat/train_000000.pairs beside this shard"
    run "$trainer" "${dpo[@]}" --set train.objective=lm
    expect_rc 2; expect_grep "these shards hold preference pairs .*set train.objective: dpo or simpo"
    run "$trainer" "${dpo[@]}" --set train.dpo_beta=-1
    expect_rc 2; expect_grep "train.dpo_beta"
    run "$trainer" "${dpo[@]}" --set train.dpo_label_smoothing=0.7
    expect_rc 2; expect_grep "train.dpo_label_smoothing"
    run "$trainer" "${dpo[@]}" --set train.steps=2 --set checkpoint.dir="$work/ck"
    expect_rc 0
    rm "$work/ck/reference_logps.safetensors"
    run "$trainer" "${dpo[@]}" --set checkpoint.dir="$work/ck" --set checkpoint.resume=auto
    expect_rc 2; expect_grep "$work/ck/reference_logps.safetensors is not there" ;;
  resume_on_more_ranks)
    # 150 steps on 2 ranks, or 75 on 2 and the rest on 3 from the step-75 checkpoint: the same
    # final loss (the global batch, the data order and AdamW's state carry over).
    run mpirun -np 2 "$trainer" "${quick[@]}" --set checkpoint.dir="$work/ckpt" --set checkpoint.every=75
    expect_rc 0
    whole=$(grep -oE "done: 150 steps, loss [0-9.]+ -> [0-9.]+" "$out" | grep -oE "[0-9.]+$")
    [ -n "$whole" ] || fail "no final loss"
    [ -f "$work/ckpt/step_000075.safetensors" ] || fail "no step-75 checkpoint"
    run mpirun -np 3 "$trainer" "${quick[@]}" --set checkpoint.resume="$work/ckpt/step_000075.safetensors" \
      --set checkpoint.dir="$work/resumed"
    expect_rc 0
    expect_grep "resumed from .*step_000075.safetensors: 75 steps done \(written by 2 rank\(s\)\); continuing at step 76"
    expect_grep "step +76/150"; expect_no_grep "step +1/150"
    expect_grep "done: 150 steps \(75 in this run\), loss [0-9.]+ -> $whole,"
    echo "final loss $whole both ways"
    # The parameters and AdamW's moments themselves (3 ranks sum in another order: not bitwise).
    same_tensors "$work/resumed/final.safetensors" "$work/ckpt/final.safetensors" 1e-6 ;;
  sharded_checkpoint_killed_mid_write_np2)
    # checkpoint.format: sharded on 2 ranks. The step-40 write pauses after rank 1 wrote its file
    # (TRAINER_TEST_SHARD_WRITE_PAUSE=1:40, test-only) and rank 1 is killed (SIGKILL): step_000040
    # never gets its manifest, so resume: auto takes step_000020 and the run ends with the loss
    # of an uninterrupted one (as many ranks: the same numbers).
    c=(--set train.steps=60 --set checkpoint.every=20 --set checkpoint.format=sharded)
    run mpirun -np 2 "$trainer" "${quick[@]}" "${c[@]}" --set checkpoint.dir="$work/whole"
    expect_rc 0
    whole=$(grep -oE "done: 60 steps, loss [0-9.]+ -> [0-9.]+" "$out" | grep -oE "[0-9.]+$")
    [ -n "$whole" ] || fail "no final loss"
    [ -f "$work/whole/step_000040/manifest.json" ] || fail "no sharded step-40 checkpoint"
    echo "+ mpirun -np 2 $trainer ... (TRAINER_TEST_SHARD_WRITE_PAUSE=1:40, then SIGKILL rank 1)"
    mpirun -np 2 -x TRAINER_TEST_SHARD_WRITE_PAUSE=1:40 "$trainer" "${quick[@]}" "${c[@]}" \
      --set checkpoint.dir="$work/ck" >"$out" 2>&1 &
    mpirun_pid=$!
    for _ in $(seq 600); do grep -q "rank 1 pauses in the write of step 40" "$out" && break; sleep 0.1; done
    [ -f "$work/ck/step_000040.tmp/rank_00001.safetensors" ] || { kill -KILL $mpirun_pid; fail "rank 1 did not write its step-40 shard"; }
    victim=$(rank_pid $mpirun_pid 1)
    [ -n "$victim" ] || { kill -KILL $mpirun_pid; fail "could not find rank 1's process"; }
    kill -KILL "$victim"
    ends_within_60s $mpirun_pid || { kill -KILL $mpirun_pid; fail "the job still runs 60 s after rank 1 died"; }
    wait $mpirun_pid
    [ ! -e "$work/ck/step_000040" ] || fail "step_000040 exists after the killed write"
    [ ! -e "$work/ck/step_000040.tmp/manifest.json" ] || fail "the killed write has a manifest"
    # Leftovers of other interrupted writes go at the resumed run's first commit.
    mkdir "$work/ck/step_000010.tmp" && touch "$work/ck/step_000010.tmp/rank_00000.safetensors.tmp"
    touch "$work/ck/final.safetensors.tmp" "$work/ck/notes.tmp"
    run mpirun -np 2 "$trainer" "${quick[@]}" "${c[@]}" --set checkpoint.dir="$work/ck" \
      --set checkpoint.resume=auto
    expect_rc 0
    expect_grep "resumed from .*/ck/step_000020: 20 steps done"
    expect_grep "removed .*/ck/step_000010.tmp, left by an interrupted checkpoint write"
    expect_grep "removed .*/ck/final.safetensors.tmp, left by an interrupted checkpoint write"
    for left in step_000010.tmp final.safetensors.tmp step_000040.tmp; do
      [ ! -e "$work/ck/$left" ] || fail "the unfinished write $work/ck/$left was left"
    done
    [ -e "$work/ck/notes.tmp" ] || fail "a file that is not a checkpoint's was removed"
    expect_grep "done: 60 steps \(40 in this run\), loss [0-9.]+ -> $whole,"
    echo "final loss $whole both ways"
    # --consolidate writes each final directory as one file: the same tensors, bitwise.
    for d in whole ck; do
      run "$trainer" "${quick[@]}" --consolidate "$work/$d/final"
      expect_rc 0; expect_grep "wrote .*/$d/final.safetensors \(60 steps done, written by 2 rank\(s\)\)"
    done
    same_tensors "$work/ck/final.safetensors" "$work/whole/final.safetensors" 0 ;;
  hybrid_uneven_nodes_np3)
    # ddp.shard_group: node on nodes of unequal size (3 ranks as nodes of 2 and 1:
    # TRAINER_TEST_RANKS_PER_NODE=2, test-only): every rank stops at start-up with exit 2 naming
    # each node's size, before any training; ddp.shard_group: world runs.
    h=(--set train.steps=3 --set train.warmup_steps=1 --set ddp.shard=gradients)
    run env TRAINER_TEST_RANKS_PER_NODE=2 mpirun -np 3 -x TRAINER_TEST_RANKS_PER_NODE "$trainer" \
      "${quick[@]}" "${h[@]}" --set ddp.shard_group=node
    expect_rc 2
    expect_grep "ddp.shard_group: 'node' needs every node to run the same number of ranks, and the nodes run 2 \(from rank 0\), 1 \(from rank 2\) ranks"
    ! grep -qE "\] step +1/" "$out" || fail "a step ran on uneven nodes"
    run env TRAINER_TEST_RANKS_PER_NODE=2 mpirun -np 3 -x TRAINER_TEST_RANKS_PER_NODE "$trainer" \
      "${quick[@]}" "${h[@]}" --set ddp.shard_group=world
    expect_rc 0 ;;
  async_checkpoint_np2)
    # checkpoint.async (the default), sharded, 2 ranks: rank 1's write of step 20 is held
    # (TRAINER_TEST_SHARD_WRITE_PAUSE=1:20:FILE, test-only) until the log shows step 40, so
    # training goes on while a write is in flight; step_000020 is committed only after that
    # (when the step-40 checkpoint starts). Then a resume from step_000020 ends with the loss of
    # an uninterrupted run, and checkpoint.async: false writes the same tensors.
    c=(--set train.steps=60 --set checkpoint.every=20 --set checkpoint.format=sharded
       --set log.every=5)
    run mpirun -np 2 "$trainer" "${quick[@]}" "${c[@]}" --set checkpoint.dir="$work/sync" \
      --set checkpoint.async=false
    expect_rc 0
    whole=$(grep -oE "done: 60 steps, loss [0-9.]+ -> [0-9.]+" "$out" | grep -oE "[0-9.]+$")
    [ -n "$whole" ] || fail "no final loss"
    expect_grep "checkpoint written: .*/sync/step_000020 \(20 steps done, 2 shard files\), the step waited"
    echo "+ mpirun -np 2 $trainer ... (TRAINER_TEST_SHARD_WRITE_PAUSE=1:20:$work/release)"
    mpirun -np 2 -x TRAINER_TEST_SHARD_WRITE_PAUSE="1:20:$work/release" "$trainer" "${quick[@]}" \
      "${c[@]}" --set checkpoint.dir="$work/ck" >"$work/held.txt" 2>&1 &
    mpirun_pid=$!
    out=$work/held.txt  # its own file: the last run's log also has a step-40 line
    for _ in $(seq 600); do grep -qE "\] step +40/" "$out" && break; sleep 0.1; done
    grep -qE "\] step +40/" "$out" || { kill -KILL $mpirun_pid; cat "$out"; fail "training did not reach step 40 while the step-20 write was held"; }
    [ ! -e "$work/ck/step_000020" ] || { kill -KILL $mpirun_pid; fail "step_000020 was committed while rank 1 still wrote it"; }
    touch "$work/release"
    ends_within_60s $mpirun_pid || { kill -KILL $mpirun_pid; fail "the job still runs 60 s after the release"; }
    wait $mpirun_pid; rc=$?
    echo "exit code $rc"; expect_rc 0
    expect_grep "checkpoint .*/ck/step_000020 \(20 steps done\): the step waited [0-9.]+ s for the copy to host memory"
    expect_grep "checkpoint written: .*/ck/step_000020 \(20 steps done, 2 shard files\): the step waited"
    expect_grep "done: 60 steps, loss [0-9.]+ -> $whole,"
    # The commit of step 20 comes after the step-40 line (it waited for the release).
    awk '/\] step +40\// { s = NR } /checkpoint written: .*step_000020/ { c = NR } END { exit !(s && c > s) }' "$out" ||
      fail "step_000020 was committed before step 40 was logged"
    run mpirun -np 2 "$trainer" "${quick[@]}" "${c[@]}" --set checkpoint.dir="$work/ck2" \
      --set checkpoint.resume="$work/ck/step_000020"
    expect_rc 0
    expect_grep "done: 60 steps \(40 in this run\), loss [0-9.]+ -> $whole,"
    for d in sync ck; do
      run "$trainer" "${quick[@]}" --consolidate "$work/$d/step_000040"
      expect_rc 0
    done
    same_tensors "$work/ck/step_000040.safetensors" "$work/sync/step_000040.safetensors" 0
    echo "final loss $whole; async and sync step-40 checkpoints bitwise equal" ;;
  sharded_resume_damaged_shard_np2)
    # checkpoint.format: sharded, 2 ranks under ddp.shard: optimizer; on resume rank 0 verifies
    # and chooses, and each rank reads only its own moments from the files. A flipped byte in rank
    # 1's file of the two newest step directories: resume auto passes over both, naming the file,
    # takes step_000015, and the run ends where the uninterrupted one does. Asked for by name, the
    # damaged directory is an error naming the file (exit 2).
    final_loss() { grep -E "done: " "$out" | sed -E 's/.*-> ([0-9.]+),.*/\1/'; }
    flip() { printf '\x42' | dd of="$1" bs=1 seek=$(( $(stat -c %s "$1") - 5 )) conv=notrunc 2>/dev/null; }
    c=(--set train.steps=30 --set checkpoint.every=15 --set log.every=15 --set ddp.shard=optimizer
       --set checkpoint.format=sharded --set checkpoint.dir="$work/ck")
    run mpirun -np 2 "$trainer" "${quick[@]}" "${c[@]}"
    expect_rc 0; whole=$(final_loss)
    [ -n "$whole" ] || fail "no final loss"
    flip "$work/ck/step_000030/rank_00001.safetensors"
    flip "$work/ck/final/rank_00001.safetensors"
    run mpirun -np 2 "$trainer" "${quick[@]}" "${c[@]}" --set checkpoint.resume=auto
    expect_rc 0
    expect_grep "passing over a damaged checkpoint: .*/ck/final/rank_00001.safetensors"
    expect_grep "passing over a damaged checkpoint: .*/ck/step_000030/rank_00001.safetensors"
    expect_grep "resumed from .*/ck/step_000015: 15 steps done"
    [ "$(final_loss)" = "$whole" ] || fail "resumed run ended at $(final_loss), the uninterrupted one at $whole"
    echo "final loss $whole both ways"
    flip "$work/ck/step_000030/rank_00001.safetensors"  # the resumed run wrote it again
    run mpirun -np 2 "$trainer" "${quick[@]}" "${c[@]}" --set checkpoint.resume="$work/ck/step_000030"
    expect_rc 2; expect_grep "checkpoint.resume: .*/ck/step_000030/rank_00001.safetensors" ;;
  sharded_checkpoint_generate_export_np2)
    # gpt-tiny, 2 ranks, ddp.shard: parameters: checkpoint.format is sharded by default, and
    # --generate and --export-hf take their weights from the sharded final directory.
    g=(--config "$src/configs/gpt-tiny.yaml" --set "data.path=$src/data/tokens-sample"
       --set train.device=cpu --set checkpoint.dir="$work/ck")
    run mpirun -np 2 "$trainer" "${g[@]}" --set train.steps=4 --set train.warmup_steps=1 \
      --set train.eval_every=0 --set ddp.shard=parameters
    expect_rc 0
    [ -f "$work/ck/final/manifest.json" ] || fail "no sharded final checkpoint"
    run "$trainer" "${g[@]}" --generate "The " --max-new-tokens 4
    expect_rc 0; expect_grep "weights: checkpoint .*/ck/final \(4 steps done\)"
    run "$trainer" "${g[@]}" --export-hf "$work/hf"
    expect_rc 0; expect_grep "wrote .*/hf/model.safetensors from checkpoint .*/ck/final"
    [ -f "$work/hf/model.safetensors" ] || fail "no exported model" ;;
  resume_errors)
    # A missing file, a checkpoint of another model, 'auto' without a directory: exit 2, named.
    run mpirun -np 2 "$trainer" "${quick[@]}" --set checkpoint.resume="$work/nope.safetensors"
    expect_rc 2; expect_grep "trainer: error: checkpoint.resume: .*nope.safetensors: cannot open the file"
    run "$trainer" "${quick[@]}" --set train.steps=30 --set checkpoint.dir="$work/ckpt"
    expect_rc 0
    run mpirun -np 2 "$trainer" "${quick[@]}" --set model.hidden_dim=64 \
      --set checkpoint.resume="$work/ckpt/final.safetensors"
    expect_rc 2
    expect_grep "'param.hidden.0.weight' is \[512, 64\] Float in the checkpoint but \[64, 64\] Float in the model"
    [ "$(grep -c "trainer: error" "$out")" = 1 ] || fail "the message is not printed exactly once"
    run "$trainer" "${quick[@]}" --set checkpoint.resume=auto
    expect_rc 2; expect_grep "checkpoint.resume: 'auto' looks for the latest checkpoint in checkpoint.dir, which is not set"
    # A checkpoint.dir that cannot be written stops the job before step 1, not at its end.
    touch "$work/file"
    run mpirun -np 2 "$trainer" "${quick[@]}" --set checkpoint.dir="$work/file/ckpt"
    expect_rc 2; expect_grep "trainer: error: checkpoint.dir = '.*/file/ckpt': cannot create it"
    expect_no_grep "step +1/" ;;
  bad_injection_spec)
    run "$trainer" "${quick[@]}" --set memory.inject_oom=1:5:sideways
    expect_rc 2; expect_grep "memory.inject_oom: '1:5:sideways': phase 'sideways' is not forward, backward or optimizer" ;;
  gpt_tiny_np2)
    # Byte-level GPT from the sample token shards: loss falls, validation loss is logged, and bits
    # per byte beside it, which for bytes (one byte per token) is the loss over ln 2.
    run mpirun -np 2 "$trainer" --config "$src/configs/gpt-tiny.yaml" --set train.steps=150 \
      --set train.eval_every=75 --set data.path="$src/data/tokens-sample"
    expect_rc 0; expect_grep "eval step 75: loss [0-9.]+ bpb [0-9.]+ over [0-9]+ validation samples"
    line=$(grep "eval step 150: loss" "$out") || fail "no evaluation at step 150"
    awk -v l="$(sed -E 's/.*loss ([0-9.]+) bpb.*/\1/' <<<"$line")" -v b="$(sed -E 's/.*bpb ([0-9.]+) over.*/\1/' <<<"$line")" \
      'BEGIN { d = b - l / log(2); exit !(d < 2e-4 && d > -2e-4) }' || fail "bpb is not loss / ln 2 for bytes: $line"
    expect_grep "tokens/s"; loss_drops ;;
  sequence_np2)
    for cell in lstm transformer; do
      run mpirun -np 2 "$trainer" --config "$src/configs/sequence-$cell.yaml" --set train.steps=150 \
        --set data.path="$src/data/timeseries-sample/series.csv"
      expect_rc 0; expect_grep "eval step 150: loss [0-9.]+ over [0-9]+ validation samples"; loss_drops
    done ;;
  cnn_np2)
    run mpirun -np 2 "$trainer" --config "$src/configs/cnn-denoise.yaml" --set train.steps=60 \
      --set data.path="$src/data/images-sample"
    expect_rc 0; expect_grep "eval step 60: loss [0-9.]+ psnr [0-9.]+ over [0-9]+ validation samples"
    loss_drops ;;
  cnn_channels_last)
    # train.channels_last: on (auto turns it on on GPUs only): NHWC weights, gradients and
    # activations train the CNN to the same loss as the contiguous layout.
    final_loss() { grep -E "done: " "$out" | sed -E 's/.*-> ([0-9.]+),.*/\1/'; }
    cnn=(--config "$src/configs/cnn-denoise.yaml" --set train.steps=30 --set data.path="$src/data/images-sample")
    run mpirun -np 2 "$trainer" "${cnn[@]}" --set train.channels_last=off
    expect_rc 0; expect_no_grep "channels-last"; plain=$(final_loss)
    run mpirun -np 2 "$trainer" "${cnn[@]}" --set train.channels_last=on
    expect_rc 0; expect_grep "channels-last \(NHWC\) convolution weights and activations"
    nhwc=$(final_loss)
    echo "final loss: contiguous $plain, channels-last $nhwc"
    awk -v a="$plain" -v b="$nhwc" 'BEGIN { d = (b - a) / a; exit !(d < 1e-3 && d > -1e-3) }' ||
      fail "channels-last final loss $nhwc differs from the contiguous run's $plain" ;;
  cnn_channels_last_sharded_checkpoint_np2)
    # Channels-last weights under ddp.shard: parameters write a sharded checkpoint in their memory
    # order (the manifest's element order, format v2). It resumes bitwise under the same layout,
    # and under row-major weights and ddp.shard: none to the same loss; --consolidate reads it.
    cnn=(--config "$src/configs/cnn-denoise.yaml" --set data.path="$src/data/images-sample"
         --set train.steps=20 --set checkpoint.every=10)
    sharded_cl=(--set train.channels_last=on --set ddp.shard=parameters)
    run mpirun -np 2 "$trainer" "${cnn[@]}" "${sharded_cl[@]}" --set checkpoint.dir="$work/a"
    expect_rc 0; expect_no_grep "single-file"
    grep -q '"trainer-sharded-checkpoint-v2"' "$work/a/step_000010/manifest.json" ||
      fail "step_000010 is not a sharded checkpoint with element orders"
    grep -q '"order"' "$work/a/step_000010/manifest.json" || fail "the manifest records no order"
    for d in b c; do mkdir -p "$work/$d"; cp -r "$work/a/step_000010" "$work/$d/"; done
    run mpirun -np 2 "$trainer" "${cnn[@]}" "${sharded_cl[@]}" --set checkpoint.dir="$work/b" \
      --set checkpoint.resume=auto
    expect_rc 0; expect_grep "resumed from .*step_000010: 10 steps done"
    run mpirun -np 2 "$trainer" "${cnn[@]}" --set train.channels_last=off --set ddp.shard=none \
      --set checkpoint.dir="$work/c" --set checkpoint.resume=auto
    expect_rc 0; expect_grep "resumed from .*step_000010: 10 steps done"
    for d in a b; do
      run "$trainer" "${cnn[@]}" --consolidate "$work/$d/final"
      expect_rc 0
    done
    same_tensors "$work/b/final.safetensors" "$work/a/final.safetensors" 0
    same_tensors "$work/c/final.safetensors" "$work/a/final.safetensors" 1e-3 ;;
  reduce_bf16)
    # ddp.reduce_dtype: bf16 on 3 ranks: gpt-tiny's final loss within 2% of the fp32 reduction's.
    final_loss() { grep -E "done: " "$out" | sed -E 's/.*-> ([0-9.]+),.*/\1/'; }
    tiny=(--config "$src/configs/gpt-tiny.yaml" --set data.path="$src/data/tokens-sample"
          --set train.steps=150 --set train.eval_samples=32)
    run mpirun -np 3 "$trainer" "${tiny[@]}"
    expect_rc 0; fp32=$(final_loss)
    run mpirun -np 3 "$trainer" "${tiny[@]}" --set ddp.reduce_dtype=bf16
    expect_rc 0; bf16=$(final_loss)
    echo "final loss: fp32 reduction $fp32, bf16 reduction $bf16"
    awk -v a="$fp32" -v b="$bf16" 'BEGIN { d = (b - a) / a; exit !(d < 0.02 && d > -0.02) }' ||
      fail "bf16-reduced final loss $bf16 is not within 2% of $fp32" ;;
  cuda_graphs_on_cpu)
    # train.cuda_graphs on a CPU run: said once, and the run trains eagerly to the same losses
    # and the same parameters (bitwise) as a run without it.
    losses() { grep -oE "(step +[0-9]+/30 loss [0-9.]+|done: .* loss [0-9.]+ -> [0-9.]+)" "$out"; }
    run mpirun -np 2 "$trainer" "${quick[@]}" --set train.steps=30 --set log.every=5 --set checkpoint.dir="$work/eager"
    expect_rc 0; eager=$(losses)
    run mpirun -np 2 "$trainer" "${quick[@]}" --set train.steps=30 --set log.every=5 --set checkpoint.dir="$work/graphs" \
      --set train.cuda_graphs=true
    expect_rc 0
    expect_grep "train.cuda_graphs: training eagerly for the rest of the run: they need a CUDA device"
    [ "$(grep -c "train.cuda_graphs" "$out")" = 1 ] || fail "the reason is not logged exactly once"
    expect_grep "done: 30 steps"
    [ "$(losses)" = "$eager" ] || fail "losses differ from the run without cuda_graphs: $(diff <(echo "$eager") <(losses))"
    echo "$(wc -l <<<"$eager") logged losses equal"
    same_tensors "$work/graphs/final.safetensors" "$work/eager/final.safetensors" 0 ;;
  model_needs_other_data)
    run mpirun -np 2 "$trainer" "${quick[@]}" --set model.name=gpt
    expect_rc 2; expect_grep "model.name: gpt needs token data \(data.dataset: tokens\)" ;;
  bad_token_shards)
    # Each malformed shard stops every rank before step 1 with exit 2 and the file's name.
    tok=(--config "$src/configs/gpt-tiny.yaml" --set data.val_path=)
    mkdir -p "$work/odd" "$work/trunc" "$work/short" "$work/empty"
    head -c 4097 /dev/urandom > "$work/odd/train_0.bin"
    run mpirun -np 2 "$trainer" "${tok[@]}" --set data.path="$work/odd"
    expect_rc 2; expect_grep "odd/train_0.bin"; expect_no_grep "step +1/"
    # llm.c's header (magic 20240520, version 1) claiming 10000 tokens over 100.
    python3 -c "import struct,sys; sys.stdout.buffer.write(struct.pack('<256i', 20240520, 1, 10000, *[0]*253) + bytes(200))" > "$work/trunc/train_0.bin"
    run mpirun -np 2 "$trainer" "${tok[@]}" --set data.path="$work/trunc"
    expect_rc 2; expect_grep "trunc/train_0.bin"; expect_grep "10000"
    head -c 100 /dev/zero > "$work/short/train_0.bin"
    run mpirun -np 2 "$trainer" "${tok[@]}" --set data.path="$work/short"
    expect_rc 2; expect_grep "short/train_0.bin"
    : > "$work/empty/train_0.bin"
    run mpirun -np 2 "$trainer" "${tok[@]}" --set data.path="$work/empty"
    expect_rc 2; expect_grep "empty/train_0.bin"; expect_no_grep "terminate called|Aborted" ;;
  bad_csv)
    csv=$work/s.csv
    seq_args=(--config "$src/configs/sequence-lstm.yaml")
    printf 'time,a,b\n' > "$csv"; for i in $(seq 1 300); do echo "$i,$i,$((i * 2))"; done >> "$csv"
    # Each mistake gets its own message: the file, the line and column where there is one, and
    # what is wrong there.
    run mpirun -np 2 "$trainer" "${seq_args[@]}" --set data.path="$csv" --set "data.features=[a, c]" --set "data.targets=[b]"
    expect_rc 2; expect_grep "trainer: error: .*/s.csv: no column 'c' \(data.features\); the header has: time, a, b$"
    sed -i '120s/.*/120,12x0,240/' "$csv"
    run mpirun -np 2 "$trainer" "${seq_args[@]}" --set data.path="$csv" --set "data.features=[a]" --set "data.targets=[b]"
    expect_rc 2; expect_grep "trainer: error: .*/s.csv:120: column 'a': '12x0' is not a number$"
    sed -i '120s/.*/120,120,240/; 77s/.*/76,5/' "$csv"
    run mpirun -np 2 "$trainer" "${seq_args[@]}" --set data.path="$csv" --set "data.features=[a]" --set "data.targets=[b]"
    expect_rc 2; expect_grep "trainer: error: .*/s.csv:77: 2 values, the header names 3 columns$"
    head -20 "$csv" > "$work/short.csv"
    run mpirun -np 2 "$trainer" "${seq_args[@]}" --set data.path="$work/short.csv" --set "data.features=[a]" --set "data.targets=[b]" --set data.window=48
    expect_rc 2
    expect_grep "trainer: error: .*/short.csv: the validation split has [0-9]+ rows, fewer than data.window \+ data.horizon = 49"
    expect_no_grep "terminate called|Aborted" ;;
  bad_png)
    mkdir -p "$work/img"
    cp "$src"/data/images-sample/*.png "$work/img/" 2>/dev/null
    head -c 3000 /dev/urandom > "$work/img/zz_broken.png"
    run mpirun -np 2 "$trainer" --config "$src/configs/cnn-denoise.yaml" --set data.path="$work/img" --set data.val_path=
    expect_rc 2; expect_grep "zz_broken.png"; expect_no_grep "terminate called|Aborted" ;;
  slow_reader_hidden)
    # A reader slower than a step (data.inject_read_delay_ms): read in the training thread, the
    # step waits on it for most of its time; with 8 workers reading ahead, hardly at all. 100 ms a
    # read, so that the reads outweigh the steps even when neighbours slow the steps down (40 ms
    # waited 19% of the time with neighbours on 2 cores).
    last_wait() { grep -E "step +60/60 " "$out" | sed -E 's/.*data wait ([0-9]+)%.*/\1/'; }
    slow=(--config "$src/configs/gpt-tiny.yaml" --set data.path="$src/data/tokens-sample" --set train.steps=60 --set log.every=20
          --set data.inject_read_delay_ms=100 --set data.prefetch=8 --set train.eval_samples=32)
    run mpirun -np 2 "$trainer" "${slow[@]}" --set data.workers=0
    expect_rc 0; sync_wait=$(last_wait)
    run mpirun -np 2 "$trainer" "${slow[@]}" --set data.workers=8
    expect_rc 0; async_wait=$(last_wait)
    echo "data wait: $sync_wait% without workers, $async_wait% with 8"
    [ "${sync_wait:-0}" -ge 30 ] || fail "without workers the step waited only ${sync_wait}%"
    [ "${async_wait:-100}" -le 10 ] || fail "with 8 workers the step still waited ${async_wait}%" ;;
  bf16_matches_fp32)
    # bf16 autocast on CPU: gpt-tiny's final loss within 2% of the fp32 run's. And bf16 is really
    # on, whatever the CPU's kernels (AVX2, AVX512-BF16, AMX): step 1's gradients (the same weights
    # and batch in both runs; AdamW's first moment after one step is 0.1 times the clipped
    # gradient) differ from fp32's by bf16's rounding. Step 1's loss cannot show it: at the
    # initial, near-uniform logits, the rounding errors average out to about 1e-6 of the loss.
    final_loss() { grep -E "done: " "$out" | sed -E 's/.*-> ([0-9.]+),.*/\1/'; }
    tiny=(--config "$src/configs/gpt-tiny.yaml" --set data.path="$src/data/tokens-sample"
          --set train.steps=200 --set train.eval_samples=32)
    run mpirun -np 2 "$trainer" "${tiny[@]}" --set train.precision=fp32
    expect_rc 0; fp32=$(final_loss)
    run mpirun -np 2 "$trainer" "${tiny[@]}" --set train.precision=bf16
    expect_rc 0; expect_grep "precision bf16"; bf16=$(final_loss)
    echo "final loss: fp32 $fp32, bf16 $bf16"
    awk -v a="$fp32" -v b="$bf16" 'BEGIN { d = (b - a) / a; exit !(d < 0.02 && d > -0.02) }' ||
      fail "bf16 final loss $bf16 is not within 2% of fp32's $fp32"
    for p in fp32 bf16; do
      run mpirun -np 2 "$trainer" "${tiny[@]}" --set train.steps=1 --set train.precision=$p \
        --set checkpoint.dir="$work/step1-$p"
      expect_rc 0
    done
    "$TRAINER_PYTHON" - "$work/step1-fp32/final.safetensors" "$work/step1-bf16/final.safetensors" <<'PY' ||
import sys
import torch
from safetensors.torch import load_file
fp32, bf16 = load_file(sys.argv[1]), load_file(sys.argv[2])
# Each element's relative difference, where the gradient is not tiny (1e-3 of its tensor's largest).
rel = []
for k in (k for k in fp32 if k.startswith("adamw.exp_avg.")):
    a, b = fp32[k].double().flatten(), bf16[k].double().flatten()
    big = a.abs() > 1e-3 * a.abs().max()
    rel.append(((b - a).abs() / a.abs())[big])
median = torch.cat(rel).median().item()
# bf16 keeps 8 significant bits: each matmul's inputs and output round by up to u = 2^-9 of their
# size, so the gradients, made by a few matmuls in turn, are typically off by a fraction of u to a
# few u. fp32 kernels that differ (block sizes, FMA order) are off by about 2^-24 times the sums'
# lengths (< 1e-5 here). The median between u / 32 and 32 u tells the two apart.
u = 2.0 ** -9
print(f"step 1 gradients, bf16 against fp32: median relative difference {median:.2e} (u = 2^-9 = {u:.2e})")
sys.exit(0 if u / 32 < median < 32 * u else 1)
PY
      fail "step 1's gradients in bf16 are not bf16 roundings of fp32's: bf16 did nothing, or too much" ;;
  metrics_and_plots)
    # log.metrics: a record per logged step and evaluation; a resumed run appends without
    # repeating steps; scripts/plot_metrics.py turns the file into PNGs.
    m=$work/ckpt/metrics.jsonl
    run mpirun -np 2 "$trainer" "${quick[@]}" --set train.steps=60 --set log.every=10 \
      --set checkpoint.dir="$work/ckpt" --set checkpoint.every=30 --set memory.inject_oom=1:45:forward
    expect_rc 0
    [ "$(grep -c '"type":"step"' "$m")" = 7 ] || fail "expected 7 step records (1, 10, ..., 60) in $m"
    # Resume from step 30: steps 31..60 run again; their old records must not stay.
    run mpirun -np 2 "$trainer" "${quick[@]}" --set train.steps=60 --set log.every=10 \
      --set checkpoint.dir="$work/ckpt" --set checkpoint.resume="$work/ckpt/step_000030.safetensors"
    expect_rc 0
    "$TRAINER_PYTHON" - "$m" <<'PY' || fail "duplicate or missing steps in the metrics file"
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1]) if '"type":"step"' in l]
print("steps:", steps)
sys.exit(0 if steps == [1, 10, 20, 30, 31, 40, 50, 60] else 1)
PY
    run "$TRAINER_PYTHON" "$src/scripts/plot_metrics.py" "$m" -o "$work/plots"
    expect_rc 0
    for f in loss lr throughput memory; do
      [ "$(head -c 8 "$work/plots/$f.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] ||
        fail "$f.png is not a PNG"
    done ;;
  checkpoint_integrity)
    # keep_last keeps the newest periodic checkpoints; resume 'auto' passes over damaged ones to
    # the newest that verifies, and the run then ends where the uninterrupted one does.
    final_loss() { grep -E "done: " "$out" | sed -E 's/.*-> ([0-9.]+),.*/\1/'; }
    c=(--set train.steps=60 --set checkpoint.dir="$work/ck" --set checkpoint.every=15 --set log.every=15)
    run mpirun -np 2 "$trainer" "${quick[@]}" "${c[@]}" --set checkpoint.keep_last=2
    expect_rc 0; whole=$(final_loss); cp "$work/ck/final.safetensors" "$work/whole.safetensors"
    expect_grep "checkpoint.keep_last = 2: deleted .*step_000015.safetensors"
    [[ ! -e "$work/ck/step_000030.safetensors" && -e "$work/ck/step_000045.safetensors" ]] ||
      fail "keep_last kept the wrong checkpoints: $(ls "$work/ck")"
    # Damage the newest two (a flipped byte in final, a truncated step_000060).
    printf '\x42' | dd of="$work/ck/final.safetensors" bs=1 seek=$(( $(stat -c %s "$work/ck/final.safetensors") - 5 )) conv=notrunc 2>/dev/null
    truncate -s 300 "$work/ck/step_000060.safetensors"
    run mpirun -np 2 "$trainer" "${quick[@]}" "${c[@]}" --set checkpoint.resume=auto
    expect_rc 0
    expect_grep "passing over a damaged checkpoint: .*final.safetensors: corrupt"
    expect_grep "passing over a damaged checkpoint: .*step_000060.safetensors"
    expect_grep "resumed from .*step_000045.safetensors: 45 steps done"
    [ "$(final_loss)" = "$whole" ] || fail "resumed run ended at $(final_loss), the uninterrupted one at $whole"
    echo "final loss $whole both ways"
    # The tensors themselves: the same ranks and order as the uninterrupted run, so bitwise.
    # (The damaged final.safetensors was overwritten by the resumed run's.)
    same_tensors "$work/ck/final.safetensors" "$work/whole.safetensors" 0
    # Asked for by name, a damaged checkpoint is an error naming it.
    # A byte of the tensor data: past the 8-byte length and the JSON header it announces.
    header=$(od -An -t u8 -N 8 "$work/ck/step_000045.safetensors" | tr -d ' ')
    printf '\x42' | dd of="$work/ck/step_000045.safetensors" bs=1 seek=$(( 8 + header + 100 )) conv=notrunc 2>/dev/null
    run mpirun -np 2 "$trainer" "${quick[@]}" "${c[@]}" --set checkpoint.resume="$work/ck/step_000045.safetensors"
    expect_rc 2; expect_grep "checkpoint.resume: .*step_000045.safetensors: corrupt" ;;
  killed_rank_ends_job)
    # Rank 1 of 3 is killed (SIGKILL) mid-training: the job ends within ddp.timeout_s + 20 s with
    # a non-zero exit, the surviving ranks' processes end with it, and the last periodic
    # checkpoint is intact. Plain mpirun ends the job itself (its message names rank 1); with
    # --enable-recovery it leaves the survivors running, and their own collective timeout must
    # end them, each naming the collective and step it waited on, and rank 1 as not answering
    # their desync exchange.
    echo "+ mpirun -np 3 $trainer ${quick[*]} --set ddp.timeout_s=10 ... (then SIGKILL rank 1)"
    mpirun -np 3 "$trainer" "${quick[@]}" --set train.steps=100000000 --set ddp.timeout_s=10 \
      --set checkpoint.dir="$work/ck" --set checkpoint.every=20 >"$out" 2>&1 &
    mpirun_pid=$!
    for _ in $(seq 600); do [ -e "$work/ck/step_000040.safetensors" ] && break; sleep 0.1; done
    victim=$(rank_pid $mpirun_pid 1); survivors=("$(rank_pid $mpirun_pid 0)" "$(rank_pid $mpirun_pid 2)")
    [ -n "$victim" ] || fail "could not find rank 1's process"
    kill -KILL "$victim"
    killed_at=$(date +%s)
    ends_within_60s $mpirun_pid || { kill -KILL $mpirun_pid; fail "the job still runs 60 s after rank 1 died"; }
    wait $mpirun_pid; rc=$?
    took=$(( $(date +%s) - killed_at ))
    echo "job ended $took s after SIGKILL with exit code $rc"
    [ "$rc" != 0 ] || fail "exit code 0 after a rank died"
    [ "$took" -le 30 ] || fail "took $took s (> ddp.timeout_s + 20 s)"
    all_end_within_10s "${survivors[@]}" || fail "a surviving rank's process (${survivors[*]}) still runs"
    expect_grep "rank 1 .*(killed|signal 9)|process rank 1 .*signal 9"
    grep -E "rank 1 .*(killed|signal 9)|process rank 1 .*signal 9" "$out" | head -1
    last=$(find "$work/ck" -maxdepth 1 -name 'step_*.safetensors' | sort | tail -1)
    run "$trainer" "${quick[@]}" --set checkpoint.dir="$work/ck" --set checkpoint.resume="$last" --dry-run
    expect_rc 0; expect_grep "resumed from .*step_[0-9]+.safetensors"
    # The survivors on their own: mpirun --enable-recovery does not end the job when rank 1 dies.
    echo "+ mpirun --enable-recovery -np 3 $trainer ${quick[*]} --set ddp.timeout_s=10 ... (then SIGKILL rank 1)"
    mpirun --enable-recovery -np 3 "$trainer" "${quick[@]}" --set train.steps=100000000 \
      --set ddp.timeout_s=10 --set log.every=1 >"$out" 2>&1 &
    mpirun_pid=$!
    for _ in $(seq 600); do grep -qE "step +3/" "$out" && break; sleep 0.1; done
    victim=$(rank_pid $mpirun_pid 1); survivors=("$(rank_pid $mpirun_pid 0)" "$(rank_pid $mpirun_pid 2)")
    [ -n "$victim" ] || fail "could not find rank 1's process"
    kill -KILL "$victim"
    killed_at=$(date +%s)
    ends_within_60s $mpirun_pid || { kill -KILL $mpirun_pid; fail "the survivors still run 60 s after rank 1 died"; }
    wait $mpirun_pid
    took=$(( $(date +%s) - killed_at ))
    echo "the survivors ended the job $took s after SIGKILL"
    [ "$took" -le 30 ] || fail "took $took s (> ddp.timeout_s + 20 s)"
    all_end_within_10s "${survivors[@]}" || fail "a surviving rank's process (${survivors[*]}) still runs"
    expect_grep "\[[02]/3\] \[error\] rank [02]: .* did not complete at step [0-9]+: waited [0-9.]+ s, past ddp.timeout_s = 10 s"
    expect_grep "\[[02]/3\] \[error\] aborting the job \(exit code 3\)"
    expect_grep "rank 1 did not reach the [a-z_()]+ of .* at step [0-9]+, or is stuck in it: no answer within 5 s"
    grep -E "did not complete at step|rank 1 did not reach" "$out" | head -2 ;;
  progress_bar)
    # log.progress auto: a live bar on a terminal (a pseudo-terminal from util-linux's script),
    # none in a redirected log, whose step lines carry the ETA instead.
    prog=("${quick[@]}" --set train.steps=100 --set log.every=25)
    frame=$'\r\e\\[K *[0-9]+/100 \\|'  # barkeep's redraw: back to column 0, clear, "N/100 |"
    frames() { grep -aoE "$frame" "$1" | wc -l; }
    echo "+ script -q -e -c '$trainer ${prog[*]}' /dev/null"
    script -q -e -c "$(printf '%q ' "$trainer" "${prog[@]}")" /dev/null </dev/null >"$out" 2>&1; rc=$?
    expect_rc 0
    n=$(frames "$out"); echo "terminal: $n frames of the bar"
    [ "$n" -ge 3 ] || fail "expected the bar redrawn at least 3 times on a terminal, found $n frames"
    expect_grep $'\r\e\\[K100/100 \\|(█){30}\\| [0-9.]+ samples/s  loss [0-9.]+  eta 0s'
    expect_grep "step +100/100 .* eta 0s"  # the step lines stay, above the bar
    run "$trainer" "${prog[@]}"
    expect_rc 0
    ! grep -q $'\r' "$out" || fail "the redirected log has carriage returns (a bar's redraws)"
    expect_no_grep "█"
    expect_grep "step +50/100 .* rss [0-9]+ MiB eta [0-9hms]+$"; expect_grep "step +100/100 .* eta 0s$"
    run "$trainer" "${prog[@]}" --set log.progress=off
    expect_rc 0; expect_grep "step +100/100 "; expect_no_grep " eta "
    # Under mpirun a rank's stderr is a pipe: auto gives lines. log.progress: bar draws anyway,
    # on rank 0 only (mpirun's --output-filename keeps each rank's output apart).
    echo "+ script -q -e -c 'mpirun -np 2 $trainer ${prog[*]}' /dev/null"
    script -q -e -c "$(printf '%q ' mpirun -np 2 "$trainer" "${prog[@]}")" /dev/null </dev/null >"$out" 2>&1; rc=$?
    expect_rc 0; expect_grep "step +100/100 .* eta 0s"
    [ "$(frames "$out")" = 0 ] || fail "auto drew a bar under mpirun, whose ranks' stderr is a pipe"
    echo "+ script -q -e -c 'mpirun -np 2 --output-filename $work/ranks $trainer ${prog[*]} --set log.progress=bar' /dev/null"
    script -q -e -c "$(printf '%q ' mpirun -np 2 --output-filename "$work/ranks" "$trainer" "${prog[@]}" \
      --set log.progress=bar)" /dev/null </dev/null >"$out" 2>&1; rc=$?
    expect_rc 0
    r0=$(cat "$work"/ranks/*/rank.0/std* > "$work/r0"; frames "$work/r0")
    r1=$(cat "$work"/ranks/*/rank.1/std* > "$work/r1"; frames "$work/r1")
    echo "mpirun, log.progress bar: rank 0 drew $r0 frames, rank 1 $r1"
    [[ $r0 -ge 3 && $r1 = 0 ]] || fail "expected frames from rank 0 only: rank 0 $r0, rank 1 $r1" ;;
  tensorboard)
    # log.tensorboard: TensorBoard's own reader finds every logged step's and evaluation's numbers
    # as scalars equal to the metrics file's; a resumed run adds a file and TensorBoard keeps each
    # step once. A build without protobuf refuses the key at start-up instead.
    tb=(--config "$src/configs/gpt-tiny.yaml" --set data.path="$src/data/tokens-sample"
        --set train.steps=40 --set log.every=10 --set train.eval_every=20 --set train.eval_samples=32
        --set checkpoint.dir="$work/ck" --set log.tensorboard="$work/tb")
    run mpirun -np 2 "$trainer" "${tb[@]}" --set checkpoint.every=20
    if grep -q "built without TensorBoard support" "$out"; then
      expect_rc 2; expect_no_grep "step +1/"
      echo "this build has no TensorBoard support (no protobuf): refused at start-up"
    else
      expect_rc 0
      [ "$(find "$work/tb" -name 'events.out.tfevents.*' | wc -l)" = 1 ] || fail "expected one event file in $work/tb"
      run mpirun -np 2 "$trainer" "${tb[@]}" --set checkpoint.resume="$work/ck/step_000020.safetensors"
      expect_rc 0
      [ "$(find "$work/tb" -name 'events.out.tfevents.*' | wc -l)" = 2 ] || fail "the resumed run did not add an event file"
      run "$TRAINER_PYTHON" - "$work/tb" "$work/ck/metrics.jsonl" <<'PY'
import json, math, sys
try:
    from tensorboard.backend.event_processing import event_accumulator as ea
except ImportError:
    sys.exit(f"tensorboard is not installed for {sys.executable} (scripts/bootstrap.sh --dev installs it)")
acc = ea.EventAccumulator(sys.argv[1], size_guidance={ea.SCALARS: 0})
acc.Reload()
tags = set(acc.Tags()["scalars"])
print("tags:", sorted(tags))
expected = {"train/loss", "train/lr", "train/grad_norm", "train/samples_per_s", "train/tokens_per_s",
            "train/micro_batch", "train/fallbacks", "train/skipped_steps", "memory/rank_0_mib",
            "memory/rank_1_mib", "eval/loss", "eval/bpb"}
if expected - tags:
    sys.exit(f"missing scalars: {sorted(expected - tags)}")
records = [json.loads(line) for line in open(sys.argv[2])]
def same(tag, kind, value):
    got = [(e.step, e.value) for e in acc.Scalars(tag)]
    want = [(r["step"], value(r)) for r in records if r["type"] == kind]
    print(tag, "steps:", [s for s, _ in got])
    if [s for s, _ in got] != [s for s, _ in want]:
        sys.exit(f"{tag}: steps {[s for s, _ in got]}, the metrics file has {[s for s, _ in want]}")
    for (step, g), (_, w) in zip(got, want):
        if not math.isclose(g, w, rel_tol=1e-6):  # float32 in TensorBoard, float64 in JSON
            sys.exit(f"{tag} at step {step}: {g} in TensorBoard, {w} in the metrics file")
same("train/loss", "step", lambda r: r["loss"])
same("train/lr", "step", lambda r: r["lr"])
same("train/tokens_per_s", "step", lambda r: r["tokens_per_s"])
same("memory/rank_1_mib", "step", lambda r: r["memory_peak_mib"][1])
same("eval/loss", "eval", lambda r: r["loss"])
same("eval/bpb", "eval", lambda r: r["bpb"])
PY
      expect_rc 0; cat "$out"
      expect_grep "train/loss steps: \[1, 10, 20, 21, 30, 40\]"
    fi ;;
  tensorboard_bad_dir)
    # A log.tensorboard that cannot be created stops every rank before step 1, naming the key.
    touch "$work/file"
    run mpirun -np 2 "$trainer" "${quick[@]}" --set log.tensorboard="$work/file/tb"
    expect_rc 2; expect_grep "trainer: error: log.tensorboard = '.*/file/tb': (cannot create it|this trainer was built without)"
    expect_no_grep "step +1/"
    [ "$(grep -c "log.tensorboard" "$out")" = 1 ] || fail "the message is not printed exactly once" ;;
  spike_guard_np2)
    # train.skip_spikes: an injected loss spike (x1000 at step 25) is skipped on every rank,
    # named in a warning with its z-score, counted on the step lines and in 'done:'; training
    # goes on. Spikes in a row past train.max_skipped_steps end the job with a checkpoint of the
    # last good state, which resumes.
    guard=(--set "train.skip_spikes={loss_z: 6, grad_norm_z: 6, window: 10}" --set train.steps=40)
    run mpirun -np 2 "$trainer" "${quick[@]}" "${guard[@]}" --set log.every=10 --set train.inject_spike=25
    expect_rc 0
    expect_grep "loss-spike guard on \(train.skip_spikes\): a step is skipped when its loss is more than 6 or its gradient norm is more than 6 standard deviations above the mean of the last 10 applied steps \(judged once 10 steps are applied\), or when its loss is not finite; 50 skipped in a row end the run \(train.max_skipped_steps\)"
    [ "$(grep -c "loss-spike guard" "$out")" = 1 ] || fail "the guard's line is not printed exactly once"
    expect_grep "step 25: spike: loss [0-9.e+]+ is [0-9.e+]+ standard deviations above the mean [0-9.]+ and grad_norm [0-9.e+]+ is [0-9.e+]+ standard deviations above the mean [0-9.]+ of the last 10 applied steps \(train.skip_spikes\): step skipped on every rank, parameters unchanged"
    [ "$(grep -c "spike:" "$out")" = 1 ] || fail "expected exactly one spike warning"
    expect_grep "step +30/40 loss [0-9.]+ .* skipped 1 "
    expect_grep "done: 40 steps, .*, 1 step\(s\) skipped"
    run mpirun -np 2 "$trainer" "${quick[@]}" "${guard[@]}" --set log.every=1 --set train.inject_spike="25; 26; 27" \
      --set train.max_skipped_steps=3 --set checkpoint.dir="$work/ckpt"
    expect_rc 1
    expect_grep "trainer: error: 3 steps in a row \(seen at step 27\) were skipped as spikes or for non-finite gradients \(train.max_skipped_steps = 3\)"
    expect_grep "The last good state \(the skipped steps changed nothing\) is in .*/ckpt/step_000027.safetensors; resuming from it goes on after step 27"
    [ -f "$work/ckpt/step_000027.safetensors" ] || fail "no checkpoint of the last good state"
    run mpirun -np 2 "$trainer" "${quick[@]}" "${guard[@]}" --set log.every=10 --set checkpoint.dir="$work/ckpt" \
      --set checkpoint.resume=auto
    expect_rc 0
    expect_grep "done: 40 steps \(13 in this run\)" ;;
  checkpoint_dir_lock_np2)
    # One run at a time in a checkpoint.dir (launcher/run_lock.h). While a run trains, a second
    # run into the same directory (a job submitted twice) stops before step 1 with exit 2, naming
    # the first's host, pid and start time, and the first trains on; --dry-run and --evaluate only
    # read, so the lock neither stops them nor is taken by them. Then the first is killed (kill -9
    # of rank 0): its lock goes with it, and a run resuming from its last checkpoint starts at once,
    # saying whose lock it took over.
    ckpt=$work/ckpt
    slow=(--set data.inject_read_delay_ms=20 --set checkpoint.dir="$ckpt" --set checkpoint.every=20)
    echo "+ mpirun -np 2 $trainer ${quick[*]} ${slow[*]} --set train.steps=100000000 &  # the first run"
    mpirun -np 2 "$trainer" "${quick[@]}" "${slow[@]}" --set train.steps=100000000 --set log.every=10 \
      >"$work/first.txt" 2>&1 &
    first=$!
    # A failed check must not leave the first run training: SIGTERM stops it (mpirun passes it on).
    trap 'kill -TERM $first 2>/dev/null; wait $first 2>/dev/null; rm -rf "$work"' EXIT
    for _ in $(seq 600); do [ -e "$ckpt/step_000040.safetensors" ] && break; sleep 0.1; done
    holder=$(rank_pid $first 0)
    if [ -z "$holder" ] || [ ! -e "$ckpt/step_000040.safetensors" ]; then cat "$work/first.txt"; fail "the first run did not get going"; fi
    run timeout 60 mpirun -np 2 "$trainer" "${quick[@]}" --set checkpoint.dir="$ckpt" --set train.steps=30
    expect_rc 2
    expect_grep "^trainer: error: checkpoint.dir = '$ckpt' is in use by another run \(host $(hostname), pid $holder, started [0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:]{8} UTC \([0-9]+ (s|min) ago\)\): two runs writing there would overwrite each other's files\. .*\(lock file $ckpt/trainer.lock\)$"
    [ "$(grep -c "is in use" "$out")" = 1 ] || fail "the message is not printed exactly once"
    expect_no_grep "step +1/"; grep "is in use" "$out"
    for readonly in --dry-run --evaluate; do
      run timeout 60 "$trainer" "${quick[@]}" --set checkpoint.dir="$ckpt" $readonly
      expect_rc 0; expect_no_grep "in use|trainer.lock"
    done
    kill -0 $first 2>/dev/null || { cat "$work/first.txt"; fail "the first run ended"; }
    grep -q "\"pid\":$holder," "$ckpt/trainer.lock" || fail "the lock file does not name the first run: $(cat "$ckpt/trainer.lock")"
    n=$(grep -oE "checkpoint written: .*step_[0-9]+" "$work/first.txt" | tail -1 | grep -oE "[0-9]+$")
    echo "+ kill -KILL $holder  # rank 0 of the first run, after its checkpoint of step $((10#$n))"
    kill -KILL "$holder"
    ends_within_60s $first || { kill -KILL $first; fail "the first run still runs 60 s after kill -9 of rank 0"; }
    wait $first
    last=$(find "$ckpt" -maxdepth 1 -name 'step_*.safetensors' | sort | tail -1)
    s=$((10#$(basename "$last" .safetensors | sed 's/^step_//')))
    run timeout 60 mpirun -np 2 "$trainer" "${quick[@]}" --set checkpoint.dir="$ckpt" \
      --set checkpoint.resume=auto --set train.steps=$((s + 10))
    expect_rc 0
    expect_grep "checkpoint.dir = '$ckpt': the run that held it last \(host $(hostname), pid $holder, started .*\) ended without a clean exit \(killed or aborted\); this run takes it over"
    expect_grep "resumed from $last: $s steps done"
    expect_grep "done: $((s + 10)) steps \(10 in this run\)"; grep "takes it over" "$out"
    [ ! -s "$ckpt/trainer.lock" ] || fail "a clean end left a record in the lock file: $(cat "$ckpt/trainer.lock")" ;;
  mixture_np2)
    # data.mixture: the sample bytes and this repository's docs, tokenized as bytes, 3 to 1 on 2
    # ranks: the start-up line, the docs source wrapping around (logged once), validation of the
    # blend and of each source apart in the log, metrics.jsonl and TensorBoard. The docs source is
    # reference.md's first 60,000 bytes, so that it wraps once in the 40 steps (about 190 windows
    # of 256 against 320 drawn) however the page grows.
    head -c 60000 "$src/docs/reference.md" >"$work/reference.md" || fail "cannot read reference.md"
    "$TRAINER_PYTHON" "$src/scripts/tokenize_text.py" "$work/reference.md" "$work/docs" \
      --encoding bytes --val-fraction 0.2 >/dev/null || fail "could not tokenize the docs"
    mix="data.mixture=[{path: $src/data/tokens-sample, weight: 3, name: code}, {path: $work/docs, weight: 1}]"
    run mpirun -np 2 "$trainer" --config "$src/configs/gpt-tiny.yaml" --set "$mix" --set data.path= \
      --set train.steps=40 --set train.eval_every=20 --set train.eval_samples=32 --set log.every=10 \
      --set log.metrics="$work/metrics.jsonl" --set log.tensorboard="$work/tb" --set data.context=256
    expect_rc 0
    expect_grep "data.mixture: 2 sources drawn by weight, each within one sample of its share in every 65536 samples: code 0.7500 \([0-9]+ windows, [0-9]+ validation; first wraps at step [0-9]+\), docs 0.2500 \([0-9]+ windows, [0-9]+ validation; first wraps at step [0-9]+\)"
    expect_grep "step [0-9]+: data source 'docs' ran out of its [0-9]+ windows and wraps around"
    [ "$(grep -c "data source 'docs' ran out" "$out")" = 1 ] || fail "the wrap is not logged exactly once"
    expect_grep "eval step 40: loss [0-9.]+ bpb [0-9.]+ over 32 validation samples \(the sources blended by weight\)"
    expect_grep "eval step 40: code: loss [0-9.]+ bpb [0-9.]+ over 32 validation samples"
    expect_grep "eval step 40: docs: loss [0-9.]+ bpb [0-9.]+ over [0-9]+ validation samples"
    "$TRAINER_PYTHON" - "$work/metrics.jsonl" "$work/tb" <<'PY' || fail "per-source metrics missing"
import glob, json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
evals = [r for r in map(json.loads, open(sys.argv[1])) if r["type"] == "eval"]
assert [r["step"] for r in evals] == [20, 40], evals
for key in ("loss", "bpb", "code/loss", "code/bpb", "docs/loss", "docs/bpb"):
    assert all(key in r for r in evals), (key, evals[-1])
acc = EventAccumulator(sys.argv[2]); acc.Reload()
tags = set(acc.Tags()["scalars"])
assert {"eval/code/loss", "eval/docs/bpb", "eval/loss"} <= tags, sorted(tags)
print("metrics.jsonl and TensorBoard have each source's loss and bpb")
PY
    ;;
  mixture_bad_configs)
    # Every bad data.mixture exits 2 before step 1 with a message naming the key and the source.
    mkdir -p "$work/wide" && "$TRAINER_PYTHON" - "$work/wide/train_000.bin" <<'PY'
import struct, sys
n = 2000
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240801, 7, n, *([0] * 253)))
    f.write(struct.pack(f"<{n}I", *[i % 200 for i in range(n)]))
PY
    ok="{path: $src/data/tokens-sample, weight: 1}"
    gpt=(--config "$src/configs/gpt-tiny.yaml" --set train.steps=2 --set train.warmup_steps=1 --set data.path=)
    for bad in "{path: $work/wide, weight: 0}|data.mixture: \[1\].weight: 0 must be above 0" \
               "{path: $work/wide, weight: -1}|data.mixture: \[1\].weight: -1 must be above 0" \
               "{path: $work/none, weight: 1}|data.mixture: \[1\].path: .*/none: no such directory" \
               "{path: $work/wide, weight: 1, name: tokens-sample}|\[1\].name: 'tokens-sample' is also \[0\]'s" \
               "{path: $work/wide, weight: 1}|data.mixture\[1\] \('wide'\): its shards hold 32-bit token ids, data.mixture\[0\] \('tokens-sample'\)'s 16-bit ones"; do
      run timeout 60 mpirun -np 2 "$trainer" "${gpt[@]}" --set "data.mixture=[$ok, ${bad%%|*}]"
      expect_rc 2; expect_grep "${bad#*|}"; expect_no_grep "step +1/"
    done
    run "$trainer" "${gpt[@]}" --set "data.mixture=[$ok]" --set data.val_path="$src/data/tokens-sample"
    expect_rc 2; expect_grep "data.val_path: not with data.mixture" ;;
  mixture_order_resume_np2_np3)
    # The sample order of a mixture (TRAINER_TEST_DATA_ORDER: each rank writes the indices it
    # reads, test-only) is the same on 1, 2 and 3 ranks, and across a kill (SIGKILL of the job
    # after its step-10 checkpoint) and a resume on 3 ranks.
    mkdir -p "$work/docs"
    "$TRAINER_PYTHON" "$src/scripts/tokenize_text.py" "$src/docs/DESIGN.md" "$work/docs" \
      --encoding bytes >/dev/null || fail "could not tokenize the docs"
    mix="data.mixture=[{path: $src/data/tokens-sample, weight: 2}, {path: $work/docs, weight: 1}]"
    order=(--config "$src/configs/gpt-tiny.yaml" --set "$mix" --set data.path= --set train.steps=30
           --set model.d_model=32 --set train.global_batch_size=13 --set train.eval_every=1000
           --set checkpoint.every=10 --set checkpoint.async=false --set log.every=10)
    for np in 1 2 3; do
      mkdir "$work/order$np"
      run env TRAINER_TEST_DATA_ORDER="$work/order$np" mpirun -np $np "$trainer" "${order[@]}"
      expect_rc 0
    done
    mkdir "$work/killed" "$work/resumed"
    echo "+ mpirun -np 2 $trainer ... (killed after its step-10 checkpoint)"
    TRAINER_TEST_DATA_ORDER="$work/killed" mpirun -np 2 -x TRAINER_TEST_DATA_ORDER "$trainer" \
      "${order[@]}" --set checkpoint.dir="$work/ck" --set data.inject_read_delay_ms=150 >"$out" 2>&1 &
    mpirun_pid=$!
    for _ in $(seq 1200); do grep -q "checkpoint written: .*step_000010" "$out" && break; sleep 0.1; done
    grep -q "checkpoint written: .*step_000010" "$out" || { kill -KILL $mpirun_pid; fail "no step-10 checkpoint"; }
    for r in 0 1; do victim=$(rank_pid $mpirun_pid $r); [ -n "$victim" ] && kill -KILL "$victim"; done
    ends_within_60s $mpirun_pid || { kill -KILL $mpirun_pid; fail "the job still runs 60 s after its ranks died"; }
    wait $mpirun_pid
    run env TRAINER_TEST_DATA_ORDER="$work/resumed" mpirun -np 3 -x TRAINER_TEST_DATA_ORDER "$trainer" \
      "${order[@]}" --set checkpoint.dir="$work/ck" --set checkpoint.resume=auto
    expect_rc 0; expect_grep "resumed from .*/ck/step_0000[12]0.safetensors"
    resumed_at=$(grep -oE "resumed from .*/ck/step_0000([12]0)" "$out" | grep -oE "[12]0$")
    "$TRAINER_PYTHON" - "$work" "$resumed_at" <<'PY' || fail "the sample orders differ"
import glob, hashlib, sys
def steps(d):
    out = {}
    for path in glob.glob(f"{d}/rank_*.txt"):
        for line in open(path):
            step, offset, *ids = map(int, line.split())
            out.setdefault(step, {})[offset] = ids
    return {s: [i for o in sorted(parts) for i in parts[o]] for s, parts in out.items()}
work, at = sys.argv[1], int(sys.argv[2])
runs = {f"np{n}": steps(f"{work}/order{n}") for n in (1, 2, 3)}
killed, resumed = steps(f"{work}/killed"), steps(f"{work}/resumed")
runs["np2 killed, np3 resumed"] = {s: (killed if s <= at else resumed)[s] for s in range(1, 31)}
digest = lambda r: hashlib.sha256(repr([r[s] for s in range(1, 31)]).encode()).hexdigest()[:16]
hashes = {name: digest(r) for name, r in runs.items()}
print(hashes)
assert all(len(r[s]) == 13 for r in runs.values() for s in range(1, 31))
assert len(set(hashes.values())) == 1, hashes
PY
    ;;
  muon_np2)
    # train.optimizer: muon through the binary: the owner plan logged once, the momentum in the
    # checkpoint in place of the hidden matrices' AdamW moments (muon.momentum.<name>), a resume
    # of 2 ranks under parameters on 1 rank under none, llama's q, k and v apart; the mistakes
    # exit 2 naming the key.
    muon=(--config "$src/configs/gpt-tiny.yaml" --set "data.path=$src/data/tokens-sample"
          --set train.optimizer=muon --set train.warmup_steps=1
          --set train.eval_every=1000 --set train.sample_every=0 --set log.every=3
          --set checkpoint.dir="$work/ck" --set checkpoint.async=false)
    run mpirun -np 2 "$trainer" "${muon[@]}" --set ddp.shard=parameters --set train.steps=6 --set checkpoint.every=6
    expect_rc 0
    expect_grep "muon: 8 hidden matrices \([0-9.]+M parameters\) in [0-9]+ bucket\(s\), Newton-Schulz \(5 steps, BFloat16\) by one owner each, balanced by FLOPs per step: rank 0: 4 .*rank 1: 4 "
    [ "$(grep -c "muon: 8 hidden matrices" "$out")" = 1 ] || fail "the owner plan is not logged exactly once"
    manifest="$work/ck/step_000006/manifest.json"
    grep -q '"muon.momentum.h.0.attn.c_attn.weight"' "$manifest" || fail "no Muon momentum in $manifest"
    ! grep -q '"adamw.exp_avg_sq.h.0.attn.c_attn.weight"' "$manifest" || fail "a Muon matrix has AdamW moments"
    grep -q '"adamw.exp_avg_sq.wte.weight"' "$manifest" || fail "the embedding has no AdamW moments"
    run "$trainer" "${muon[@]}" --set train.steps=8 --set checkpoint.resume="$work/ck/step_000006"
    expect_rc 0; expect_grep "resumed from .*step_000006: 6 steps done"; expect_grep "done: 8 steps"
    run "$trainer" "${muon[@]}" --set train.optimizer=adamw --set train.steps=8 --set checkpoint.resume="$work/ck/step_000006"
    expect_rc 2; expect_grep "written for another optimizer \(compare the train.optimizer key"
    # llama: q_proj, k_proj and v_proj each a matrix, as Hugging Face stores them (4 blocks x 7).
    run "$trainer" --config "$src/configs/llama-tiny.yaml" --set "data.path=$src/data/tokens-sample" \
      --set train.optimizer=muon --set train.steps=1 --set train.global_batch_size=4 \
      --set train.eval_every=1000 --set train.sample_every=0 --set checkpoint.dir=
    expect_rc 0; expect_grep "muon: 28 hidden matrices"
    run "$trainer" --config "$src/configs/mlp.yaml" --set train.optimizer=muon --set checkpoint.dir=
    expect_rc 2; expect_grep "train.optimizer: muon needs a model that names its hidden layers' weight matrices"
    for bad in "train.schedule=wsdx|train.schedule: 'wsdx' is not one of: cosine, linear, constant, wsd" \
               "train.decay_fraction=1.5|train.decay_fraction: 1.5 is out of range" \
               "train.decay_shape=sqrt|train.decay_shape: 'sqrt' is not one of: linear, cosine, 1-sqrt" \
               "train.muon_momentum=1|train.muon_momentum: 1 is out of range: must be in \[0, 1\)" \
               "train.muon_lr=0|train.muon_lr: 0 is out of range"; do
      run "$trainer" "${muon[@]}" --set train.steps=2 --set "${bad%%|*}"
      expect_rc 2; expect_grep "${bad#*|}"; expect_no_grep "step +1/"
    done ;;
  checkpoint_disk_full)
    # checkpoint.dir on a 90 KB file system (a tmpfs) where the step-2 checkpoint (67 KB) fits and
    # no other does. The periodic writes of steps 4 and 6 fail (ENOSPC): each warned, its partial
    # file deleted, and training goes on; step 8's is the third in a row
    # (checkpoint.max_failed_writes: 3): exit 5 naming it. Step 2's checkpoint and metrics.jsonl
    # are whole, and with room again the run resumes from step 2 and ends with every step's record
    # once. Then a file fills the disk: the final checkpoint, which may not fail, is exit 5, and
    # the last one is untouched. Last, log.metrics on an 8 KB file system: the records that do not
    # fit are dropped whole (no line cut short) and training ends normally.
    mount_tmpfs "$work/disk" 90k
    ck=$work/disk/ck
    d=(--config "$src/configs/mlp.yaml" --set model.hidden_dim=64 --set model.depth=1
       --set train.warmup_steps=1 --set log.every=1 --set checkpoint.every=2 --set checkpoint.dir="$ck")
    run "$trainer" "${d[@]}" --set train.steps=12
    expect_rc 5
    expect_grep "checkpoint $ck/step_000004.safetensors \(4 steps done\) was not written: rank 0 could not write its file: .*No space left on device. Training goes on and the next checkpoint tries again \(1 of checkpoint.max_failed_writes = 3 failed in a row\); the last complete checkpoint: $ck/step_000002.safetensors"
    expect_grep "checkpoint $ck/step_000006.safetensors \(6 steps done\) was not written: .*\(2 of checkpoint.max_failed_writes = 3"
    expect_grep "^trainer: error: checkpoint $ck/step_000008.safetensors \(8 steps done\) was not written: .*No space left on device; 3 checkpoints failed in a row \(checkpoint.max_failed_writes = 3\). The last complete checkpoint: $ck/step_000002.safetensors"
    expect_grep "\] step +10/12"  # the writes of steps 4, 6 and 8 failed; training went on
    left=$(cd "$ck" && echo *)
    [ "$left" = "metrics.jsonl step_000002.safetensors trainer.lock" ] || fail "$ck holds: $left"
    whole_records "$ck/metrics.jsonl" 1
    mount -o remount,size=1m "$work/disk" || fail "cannot grow the tmpfs"
    run "$trainer" "${d[@]}" --set train.steps=12 --set checkpoint.resume=auto
    expect_rc 0; expect_grep "resumed from $ck/step_000002.safetensors: 2 steps done"
    expect_grep "done: 12 steps \(10 in this run\)"
    whole_records "$ck/metrics.jsonl" 1 12
    # The disk full again (but a few pages, for the lock's record): the final checkpoint fails.
    sum=$(md5sum <"$ck/step_000012.safetensors")
    free=$(df --output=avail -B1 "$work/disk" | tail -1)
    head -c $((free - 16384)) /dev/zero >"$work/disk/filler" || fail "cannot fill the tmpfs"
    run "$trainer" "${d[@]}" --set train.steps=14 --set checkpoint.resume=auto
    expect_rc 5
    expect_grep "resumed from $ck/step_000012.safetensors: 12 steps done"
    expect_grep "step_000014.safetensors \(14 steps done\) was not written: .*No space left on device. Training goes on"
    expect_grep "^trainer: error: checkpoint $ck/final.safetensors \(14 steps done\) was not written: rank 0 could not write its file: .*No space left on device. The last complete checkpoint: $ck/step_000012.safetensors"
    [ "$(md5sum <"$ck/step_000012.safetensors")" = "$sum" ] || fail "the last complete checkpoint changed"
    [ ! -e "$ck/final.safetensors.tmp" ] || fail "the failed final write left its partial file"
    whole_records "$ck/metrics.jsonl" 1
    # log.metrics alone on a full disk: records dropped whole, the run ends normally.
    mount_tmpfs "$work/small" 8k
    run "$trainer" "${d[@]}" --set train.steps=40 --set checkpoint.dir="$work/ck2" \
      --set log.metrics="$work/small/metrics.jsonl"
    expect_rc 0; expect_grep "done: 40 steps"
    expect_grep "log.metrics: a record \(step [0-9]+\) could not be written to $work/small/metrics.jsonl: No space left on device; it is dropped and training goes on"
    whole_records "$work/small/metrics.jsonl" 1
    n=$(grep -c '"type":"step"' "$work/small/metrics.jsonl")
    [ "$n" -lt 40 ] || fail "all 40 records fit in 8 KB: the test does not fill the disk"
    echo "$n of 40 step records fit; the rest dropped whole" ;;
  checkpoint_disk_full_sharded_np2)
    # As checkpoint_disk_full, sharded on 2 ranks (checkpoint.async, the default): the ranks'
    # files of steps 4, 6 and 8 do not fit (a rank whose file did fit votes with the one whose
    # file did not: every rank agrees, none waits), the step directories' partial files go, the
    # third failure is exit 5 on every rank, and the run resumes from step 2.
    mount_tmpfs "$work/disk" 90k
    ck=$work/disk/ck
    d=(--config "$src/configs/mlp.yaml" --set model.hidden_dim=64 --set model.depth=1
       --set train.warmup_steps=1 --set log.every=1 --set checkpoint.every=2
       --set checkpoint.format=sharded --set checkpoint.dir="$ck")
    run mpirun -np 2 "$trainer" "${d[@]}" --set train.steps=12
    expect_rc 5
    expect_grep "checkpoint $ck/step_000004 \(4 steps done\) was not written: rank [01] could not write its shard: .*No space left on device. Training goes on"
    expect_grep "^trainer: error: checkpoint $ck/step_000008 \(8 steps done\) was not written: .*3 checkpoints failed in a row"
    left=$(cd "$ck" && echo *)
    [ "$left" = "metrics.jsonl step_000002 trainer.lock" ] || fail "$ck holds: $left"
    whole_records "$ck/metrics.jsonl" 1
    mount -o remount,size=1m "$work/disk" || fail "cannot grow the tmpfs"
    run mpirun -np 2 "$trainer" "${d[@]}" --set train.steps=12 --set checkpoint.resume=auto
    expect_rc 0; expect_grep "resumed from $ck/step_000002: 2 steps done"
    expect_grep "done: 12 steps \(10 in this run\)"
    whole_records "$ck/metrics.jsonl" 1 12
    # final/ written again by a resumed run: swapped in whole (RENAME_EXCHANGE), the old one gone.
    run mpirun -np 2 "$trainer" "${d[@]}" --set train.steps=14 --set checkpoint.resume="$ck/final"
    expect_rc 0; expect_grep "checkpoint written: $ck/final \(14 steps done"
    grep -qE '"step": ?14([^0-9]|$)' "$ck/final/manifest.json" || fail "final/ is not step 14's"
    left=$(cd "$ck" && echo final*)
    [ "$left" = final ] || fail "$ck holds: $left" ;;
  checkpoint_write_error)
    # A write the file system refuses for another reason than space is not retried: under
    # `ulimit -f` (SIGXFSZ ignored: the write fails with EFBIG) the step-2 checkpoint (13.6 MB)
    # does not fit the 8 MiB limit (MPI's start needs a few), and the job stops at once with exit 5
    # naming it and the reason; its partial file is gone and metrics.jsonl is whole.
    k=(--config "$src/configs/mlp.yaml" --set model.hidden_dim=1024 --set model.depth=2
       --set train.warmup_steps=1 --set log.every=1 --set checkpoint.every=2 --set train.steps=8
       --set checkpoint.dir="$work/ck")
    run bash -c 'trap "" XFSZ; ulimit -f 8192; exec "$@"' limited "$trainer" "${k[@]}"
    expect_rc 5
    expect_grep "^trainer: error: checkpoint $work/ck/step_000002.safetensors \(2 steps done\) was not written: rank 0 could not write its file: .*: File too large. The last complete checkpoint: none"
    expect_no_grep "Training goes on"
    left=$(cd "$work/ck" && echo *)
    [ "$left" = "metrics.jsonl trainer.lock" ] || fail "$work/ck holds: $left"
    whole_records "$work/ck/metrics.jsonl" 1 ;;
  consolidate_never_overwrites_np2)
    # The scale guide's ZeRO example in small: a sharded run on 2 ranks writes final/ (4 steps);
    # resumed on 1 rank (unsharded: one file) it writes final.safetensors (6 steps), the path
    # --consolidate final would write: exit 2 naming it, and the file is byte for byte what it
    # was; --force writes over it. --export-hf and --export-peft refuse a directory with files the
    # same way (before they load anything); --force with another command is exit 2.
    z=(--config "$src/configs/mlp.yaml" --set model.hidden_dim=64 --set model.depth=1
       --set train.warmup_steps=1 --set checkpoint.dir="$work/z3")
    run mpirun -np 2 "$trainer" "${z[@]}" --set ddp.shard=optimizer --set train.steps=4
    expect_rc 0; [ -f "$work/z3/final/manifest.json" ] || fail "no sharded final checkpoint"
    run "$trainer" "${z[@]}" --set train.steps=6 --set checkpoint.resume=auto
    expect_rc 0; expect_grep "resumed from $work/z3/final: 4 steps done"
    sum=$(md5sum <"$work/z3/final.safetensors")
    run "$trainer" "${z[@]}" --consolidate "$work/z3/final"
    expect_rc 2
    expect_grep "^trainer: error: --consolidate: $work/z3/final.safetensors exists \(a checkpoint of 6 steps\) and is not overwritten: write elsewhere, move it away, or give --force"
    [ "$(md5sum <"$work/z3/final.safetensors")" = "$sum" ] || fail "--consolidate changed the newer checkpoint"
    run "$trainer" "${z[@]}" --consolidate "$work/z3/final" --force
    expect_rc 0; expect_grep "wrote $work/z3/final.safetensors \(4 steps done, written by 2 rank\(s\)\)"
    mkdir "$work/hf" && echo keep >"$work/hf/notes.txt"
    for flag in --export-hf --export-peft; do
      run "$trainer" --config "$src/configs/gpt-tiny.yaml" "$flag" "$work/hf"
      expect_rc 2
      expect_grep "^trainer: error: $flag: $work/hf exists \(a directory with files\) and is not overwritten"
    done
    [ "$(ls "$work/hf")" = notes.txt ] || fail "an export wrote into $work/hf"
    run "$trainer" "${z[@]}" --force
    expect_rc 2; expect_grep "^trainer: error: --force goes with --consolidate, --export-hf or --export-peft" ;;
  foreign_checkpoint_dir)
    # A checkpoint.dir holding another model's checkpoint: a fresh run would write its own among
    # them (its final over theirs): exit 2 before step 1, naming the file and how it differs, and
    # the other model's checkpoint is untouched; resume: auto names the one it would take. The
    # same model starts fresh there as before.
    m=(--config "$src/configs/mlp.yaml" --set model.depth=1 --set train.warmup_steps=1
       --set train.steps=2 --set checkpoint.dir="$work/ck")
    run "$trainer" "${m[@]}" --set model.hidden_dim=64
    expect_rc 0
    sum=$(md5sum <"$work/ck/final.safetensors")
    run "$trainer" "${m[@]}" --set model.hidden_dim=32
    expect_rc 2
    expect_grep "^trainer: error: checkpoint.dir: $work/ck holds another model's checkpoint: $work/ck/final.safetensors: 'param.hidden.0.weight' is \[64, 64\] Float in the checkpoint but \[32, 64\] Float in the model .*give it a checkpoint.dir of its own"
    expect_no_grep "step +1/"
    [ "$(md5sum <"$work/ck/final.safetensors")" = "$sum" ] || fail "the other model's checkpoint changed"
    run "$trainer" "${m[@]}" --set model.hidden_dim=32 --set checkpoint.resume=auto
    expect_rc 2; expect_grep "^trainer: error: checkpoint.resume: $work/ck/final.safetensors: 'param.hidden.0.weight' is \[64, 64\]"
    run "$trainer" "${m[@]}" --set model.hidden_dim=64
    expect_rc 0 ;;
  sharded_manifest_mixed_steps_np2)
    # A step directory whose files belong to different steps (rank 1's file of step 2 copied over
    # step 4's): resuming from it is exit 2 naming the file, its step and the manifest's, as is
    # --consolidate; resume: auto passes over it to step 2, saying so.
    s=(--config "$src/configs/mlp.yaml" --set model.hidden_dim=64 --set model.depth=1
       --set train.warmup_steps=1 --set checkpoint.format=sharded --set checkpoint.every=2
       --set checkpoint.dir="$work/ck")
    run mpirun -np 2 "$trainer" "${s[@]}" --set train.steps=4
    expect_rc 0
    cp "$work/ck/step_000002/rank_00001.safetensors" "$work/ck/step_000004/"
    rm -r "$work/ck/final"
    mixed="$work/ck/step_000004/rank_00001.safetensors: a shard file of step 2 beside the manifest of step 4 \($work/ck/step_000004/manifest.json\): the directory mixes the files of two checkpoints"
    run mpirun -np 2 "$trainer" "${s[@]}" --set train.steps=6 --set checkpoint.resume="$work/ck/step_000004"
    expect_rc 2; expect_grep "^trainer: error: checkpoint.resume: $mixed"; expect_no_grep "step +5/"
    run "$trainer" "${s[@]}" --consolidate "$work/ck/step_000004"
    expect_rc 2; expect_grep "^trainer: error: $mixed"
    run mpirun -np 2 "$trainer" "${s[@]}" --set train.steps=6 --set checkpoint.resume=auto
    expect_rc 0; expect_grep "passing over a damaged checkpoint: $mixed"
    expect_grep "resumed from $work/ck/step_000002: 2 steps done" ;;
  data_path_symlink_loop)
    # Symbolic links that loop, as data.path or as a file inside its directory: exit 2 before
    # step 1 naming the path and the system's reason (token shards, a directory of shards, PNG
    # images).
    ln -s loop "$work/loop"
    mkdir "$work/tokens" && cp "$src"/data/tokens-sample/*.bin "$work/tokens/"
    ln -s train_000001.bin "$work/tokens/train_000001.bin"
    t=(--config "$src/configs/gpt-tiny.yaml" --set train.steps=1)
    run "$trainer" "${t[@]}" --set data.path="$work/loop"
    expect_rc 2; expect_grep "^trainer: error: data.path: $work/loop: Too many levels of symbolic links"
    run "$trainer" "${t[@]}" --set data.path="$work/tokens"
    expect_rc 2; expect_grep "^trainer: error: $work/tokens/train_000001.bin: cannot open the token shard: Too many levels of symbolic links"
    run "$trainer" --config "$src/configs/cnn-denoise.yaml" --set train.steps=1 --set data.path="$work/loop"
    expect_rc 2; expect_grep "^trainer: error: data.path: $work/loop: Too many levels of symbolic links" ;;
  checkpoint_killed_mid_write)
    # One process, single-file checkpoints: the step-4 write pauses with all but its last tensor
    # in step_000004.safetensors.tmp (TRAINER_TEST_SHARD_WRITE_PAUSE=0:4, test-only) and the
    # process is killed (SIGKILL). Nothing it left is misread: resume: auto takes step 2, the
    # half-written file goes at the first commit, and metrics.jsonl holds every step once.
    # (The sharded format's kill: sharded_checkpoint_killed_mid_write_np2.)
    k=(--config "$src/configs/mlp.yaml" --set model.hidden_dim=64 --set model.depth=1
       --set train.warmup_steps=1 --set log.every=1 --set checkpoint.every=2 --set train.steps=8
       --set checkpoint.dir="$work/ck")
    echo "+ $trainer ... (TRAINER_TEST_SHARD_WRITE_PAUSE=0:4, then SIGKILL)"
    TRAINER_TEST_SHARD_WRITE_PAUSE=0:4 "$trainer" "${k[@]}" >"$out" 2>&1 &
    pid=$!
    for _ in $(seq 600); do grep -q "rank 0 pauses in the write of step 4" "$out" && break; sleep 0.1; done
    [ -s "$work/ck/step_000004.safetensors.tmp" ] || { kill -KILL $pid; fail "no half-written step-4 file"; }
    kill -KILL $pid; wait $pid
    [ ! -e "$work/ck/step_000004.safetensors" ] || fail "the killed write was renamed into place"
    whole_records "$work/ck/metrics.jsonl" 1
    # (every 3 steps: a write of step 4 would replace the half-written file, not remove it)
    run "$trainer" "${k[@]}" --set checkpoint.resume=auto --set checkpoint.every=3
    expect_rc 0; expect_grep "resumed from $work/ck/step_000002.safetensors: 2 steps done"
    expect_grep "removed $work/ck/step_000004.safetensors.tmp, left by an interrupted checkpoint write"
    [ ! -e "$work/ck/step_000004.safetensors.tmp" ] || fail "the half-written file was left"
    whole_records "$work/ck/metrics.jsonl" 1 8 ;;
  *) echo "unknown case $case_name"; exit 2 ;;
esac
echo "PASS [$case_name]"
