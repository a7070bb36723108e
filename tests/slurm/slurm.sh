#!/usr/bin/env bash
# The trainer under a real SLURM (DESIGN.md, test tier 3, label `slurm`): the local single-node
# cluster of scripts/local-slurm.sh. Exit 77 (skipped) when no SLURM answers.
#   slurm.sh CASE TRAINER SOURCE_DIR
set -uo pipefail
case_name=$1 trainer=$2 src=$3
if ! "$src/scripts/local-slurm.sh" --check; then
  echo "SKIP [$case_name]: no SLURM answers here (run scripts/local-slurm.sh as root)"
  exit 77
fi
work=$(mktemp -d)
export TRAINER_CASE_WORK=$work  # marks this case's processes (srun passes the environment on)
jobs=()
cleanup() {
  [ ${#jobs[@]} -gt 0 ] && scancel "${jobs[@]}" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
source "$src/tests/case_lib.sh"
# The job's log becomes the output the expectations read.
job_log() { cat "$work"/job-*.log >>"$out" 2>/dev/null; }

quick=(--config "$src/configs/quickstart.yaml" --set train.steps=60 --set train.warmup_steps=5 --set log.every=20)
# Resources of the shipped batch script scaled down to this CPU-only node.
small=(--ntasks-per-node=3 --cpus-per-task=1 --gpus-per-node=0 --output="$work/job-%j.log")

case $case_name in
  srun_pmix_np3)
    run timeout 120 srun --mpi=pmix -n 3 "$trainer" "${quick[@]}"
    expect_rc 0
    expect_grep "launched by srun: 3 rank\(s\) on 1 node\(s\)"
    expect_grep "rank +2 +host .* local rank 2/3"
    expect_grep "done: 60 steps, loss 2.7732 -> " ;;
  srun_without_pmix)
    # MpiDefault=none: srun gives the tasks no PMIx; every task stops before MPI_Init, one speaks.
    run timeout 60 srun --mpi=none -n 2 "$trainer" "${quick[@]}"
    expect_rc 2
    expect_grep "trainer: error: started by srun without --mpi=pmix \(SLURM_PROCID=0\)"
    [ "$(grep -c "started by srun" "$out")" = 1 ] || fail "the message is not printed exactly once"
    expect_no_grep "MPI_Init|OMPI was not built" ;;
  sbatch_script_np3)
    # The shipped batch script, as a user submits it (sbatch --wait returns the job's exit code).
    cd "$work"
    run env TRAINER="$trainer" timeout 180 sbatch --wait "${small[@]}" "$src/slurm/train.sbatch" \
      "$src/configs/quickstart.yaml" --set train.steps=60 --set train.warmup_steps=5
    job_log
    expect_rc 0
    expect_grep "launched by srun: 3 rank\(s\)"
    expect_grep "done: 60 steps" ;;
  srun_killed_rank_np3)
    # Task 1 of 3 is killed (SIGKILL) mid-training: the step ends within ddp.timeout_s + 20 s with
    # a non-zero exit and srun naming task 1.
    echo "+ srun --mpi=pmix -n 3 $trainer ... --set ddp.timeout_s=10 (then SIGKILL task 1)"
    timeout 120 srun --mpi=pmix -n 3 "$trainer" "${quick[@]}" --set train.steps=100000000 \
      --set ddp.timeout_s=10 --set log.every=50 >"$out" 2>&1 &
    srun_pid=$!
    for _ in $(seq 600); do grep -q "step  *50/" "$out" && break; sleep 0.1; done
    victim=""
    for p in $(pgrep -f -- "$trainer"); do
      env_of=$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null)
      grep -qx "SLURM_PROCID=1" <<<"$env_of" && grep -qx "TRAINER_CASE_WORK=$work" <<<"$env_of" && victim=$p
    done
    [ -n "$victim" ] || fail "could not find task 1's process"
    kill -KILL "$victim"
    killed_at=$(date +%s)
    wait $srun_pid; rc=$?
    took=$(( $(date +%s) - killed_at ))
    echo "step ended $took s after SIGKILL with exit code $rc"
    [ "$rc" != 0 ] || fail "exit code 0 after a task died"
    [ "$took" -le 30 ] || fail "took $took s (> ddp.timeout_s + 20 s)"
    expect_grep "srun: error: .*: task 1: Killed" ;;
  mpirun_in_sbatch_np3)
    cd "$work"
    run timeout 180 sbatch --wait -n 3 --output="$work/job-%j.log" --wrap "mpirun $trainer ${quick[*]}"
    job_log
    expect_rc 0
    expect_grep "launched by mpirun: 3 rank\(s\)"
    expect_grep "done: 60 steps" ;;
  scancel_then_resume)
    # scancel sends SIGTERM to every task: the ranks agree on a last step, rank 0 writes
    # final.safetensors, and all exit 143 well within KillWait. The same job submitted again with
    # checkpoint.resume: auto continues after that step (a preempted, requeued job).
    cd "$work"
    job=$(env TRAINER="$trainer" sbatch --parsable "${small[@]}" --ntasks-per-node=2 \
      "$src/slurm/train.sbatch" "$src/configs/quickstart.yaml" --set train.steps=1000000 \
      --set train.warmup_steps=5 --set log.every=50 --set checkpoint.dir="$work/ckpt" \
      --set checkpoint.resume=auto) || fail "sbatch failed"
    jobs+=("$job")
    for _ in $(seq 1 60); do grep -q "step  *50/" "$work"/job-*.log 2>/dev/null && break; sleep 1; done
    grep -q "step  *50/" "$work"/job-*.log 2>/dev/null || { job_log; fail "the job did not reach step 50 in 60 s"; }
    scancel "$job"
    for _ in $(seq 1 60); do squeue -h -j "$job" 2>/dev/null | grep -q . || break; sleep 1; done
    job_log
    expect_grep "stop requested \(signal\): stopping after step [0-9]+"
    [ "$(grep -c "stop requested" "$out")" = 1 ] || fail "the stop is not logged exactly once"
    expect_grep "checkpoint written: .*/ckpt/final.safetensors"
    [ -s "$work/ckpt/final.safetensors" ] || fail "no final.safetensors"
    expect_grep "tasks 0-1: Exited with exit code 143"
    expect_grep "auto: no checkpoint in .*/ckpt yet; starting at step 1"
    stopped=$(grep -oE "stopping after step [0-9]+" "$out" | grep -oE "[0-9]+$")
    # Resubmitted: 100 more steps, from the checkpoint.
    rm -f "$work"/job-*.log
    run env TRAINER="$trainer" timeout 180 sbatch --wait "${small[@]}" --ntasks-per-node=2 \
      "$src/slurm/train.sbatch" "$src/configs/quickstart.yaml" --set train.steps=$((stopped + 100)) \
      --set train.warmup_steps=5 --set log.every=50 --set checkpoint.dir="$work/ckpt" \
      --set checkpoint.resume=auto
    job_log
    expect_rc 0
    expect_grep "resumed from .*/ckpt/final.safetensors: $stopped steps done \(written by 2 rank\(s\)\); continuing at step $((stopped + 1))"
    expect_grep "done: $((stopped + 100)) steps \(100 in this run\)" ;;
  *) echo "unknown case $case_name"; exit 2 ;;
esac
echo "PASS [$case_name]"
