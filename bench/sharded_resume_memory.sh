#!/usr/bin/env bash
# Rank 0's peak resident memory when a run resumes from a sharded checkpoint (issue 25, item 4:
# "gathering the full state to rank 0 runs out of CPU memory"). The 25.4M-parameter gpt of
# bench/checkpoint_stall.sh (8 blocks, 512 wide, context 64) trains 1 step on 2 CPU ranks under
# ddp.shard: optimizer and writes a sharded checkpoint; then, round by round, each binary starts
# 2 ranks that resume from it with --dry-run (start-up, the Trainer, resume; no step) and
# /usr/bin/time reports each rank's peak resident set (VmHWM, "maximum resident set size").
# "no resume" is the same start-up without checkpoint.resume: what start-up costs by itself.
# Prints one line per rank and run; compare rank 0's medians. A shared machine: compare ratios.
#   bench/sharded_resume_memory.sh [ROUNDS] [BEFORE_BINARY]
#   (default 3 rounds; BEFORE_BINARY: a trainer built from the commit before, to compare with)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
rounds=${1:-3}
before=${2:-}
after=${TRAINER_BIN:-build/trainer}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source bench/gpt25m.sh  # the model: gpt25m=(...)
gpt25m+=(--set ddp.shard=optimizer --set checkpoint.format=sharded)
mpirun -np 2 "$after" "${gpt25m[@]}" --set train.steps=1 --set checkpoint.dir="$work/ck" \
  >"$work/write.log" 2>&1 || { cat "$work/write.log"; exit 1; }
[ -f "$work/ck/final/manifest.json" ] || { echo "no sharded checkpoint written"; exit 1; }
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
# rank R peak of one 2-rank start-up: "LABEL rank R max_rss_kib N".
peaks() {
  local label=$1 bin=$2
  shift 2
  # The single quotes are meant: each rank's own shell expands its rank.
  # shellcheck disable=SC2016
  mpirun -np 2 bash -c '/usr/bin/time -f "rank ${OMPI_COMM_WORLD_RANK} max_rss_kib %M" \
    -o "$0.rank${OMPI_COMM_WORLD_RANK}" "$@"' "$work/time" "$bin" "${gpt25m[@]}" \
    --set train.steps=2 --set checkpoint.dir="$work/out" --dry-run "$@" >"$work/run.log" 2>&1 ||
    { cat "$work/run.log"; exit 1; }
  for r in 0 1; do echo "$label $(tail -1 "$work/time.rank$r")"; done
}
for round in $(seq "$rounds"); do
  peaks "round $round no-resume" "$after"
  [ -z "$before" ] || peaks "round $round before" "$before" --set checkpoint.resume="$work/ck/final"
  peaks "round $round after" "$after" --set checkpoint.resume="$work/ck/final"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
