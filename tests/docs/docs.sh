#!/usr/bin/env bash
# The `docs` tier (docs/DESIGN.md, "Tests and benchmarks"): runs the commands of one page of the
# user documentation as written, on the CPU, and fails on the first one that exits non-zero.
#   docs.sh PAGE TRAINER SOURCE_DIR      (PAGE: README.md or docs/guides/NAME.md)
#
# Every ```sh block of README.md and docs/guides/*.md carries a mark after the language:
#   ```sh run     run here, in order, the blocks of a page in one bash (set -euo pipefail)
#   ```sh gpu     needs CUDA GPUs (the gpu tier and bench/ cover what runs there)
#   ```sh slurm   needs a SLURM cluster (the slurm tier runs these commands' cases)
#   ```sh net     downloads (nothing outside PyPI and Debian is reachable from the test machines)
#   ```sh build   installs or builds (scripts/bootstrap.sh, scripts/test.sh: not inside a test)
# A ```sh block without one of these marks fails the page: every command is either run or says
# why not. Lines between `<!-- docs-test` and `-->` (hidden when the page is rendered) run too, in
# their place: they make what a reader downloads and the test cannot (a small file in the same
# format).
#
# The blocks run in a fresh temporary directory laid out like a clone: configs/, scripts/, slurm/
# and data/'s samples are the source tree's (data/ is a directory of its own, so that what the
# commands write there stays in the temporary directory), and build/trainer runs TRAINER with
# small step counts: `--set train.steps=S --set train.warmup_steps=2` are appended to every
# command, S being DOCS_STEPS (default 8), or twice that for a command that resumes
# (checkpoint.resume: it trains S more steps); a command whose own train.steps is at most 50 keeps
# it (and its warmup). `--set train.threads=1` too: a single process's two intra-op threads on a
# machine whose cores are busy with other tests took 7 times as long as one thread.
set -uo pipefail
page=$1 trainer=$2 src=$3
steps=${DOCS_STEPS:-8}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The blocks, with the line each starts on.
blocks=$work/blocks.sh
# shellcheck disable=SC2016  # expanded by the bash that runs the blocks
echo 'PS4="+ [\${SECONDS}s] "' >"$blocks"  # each command with the seconds since the page started
if ! awk -v page="$page" -v out="$blocks" '
  /^[ \t]*```/ && !inblock {  # a fence, also indented in a list item
    inblock = 1; info = $0; sub(/^[ \t]*```/, "", info); sub(/[ \t]+$/, "", info)
    if (info ~ /^(sh|bash)( |$)/) {
      split(info, w, " ")
      if (w[2] == "run") { run = 1; printf "echo \"\\$ [%s:%d]\"\n", page, NR >> out; runnable++ }
      else if (w[2] !~ /^(gpu|slurm|net|build)$/) {
        printf "%s:%d: a ```%s block needs a mark: run, gpu, slurm, net or build\n", page, NR, info
        bad = 1
      }
    }
    next
  }
  /^[ \t]*```/ && inblock { inblock = 0; run = 0; next }
  /^<!-- docs-test/ && !inblock { run = 1; printf "echo \"\\$ [%s:%d] (hidden)\"\n", page, NR >> out; next }
  /^-->/ && run && !inblock { run = 0; next }
  run { print >> out }
  END { if (!runnable && !bad) { printf "%s: no ```sh run block\n", page; bad = 1 } exit bad }
' "$src/$page"; then
  echo "FAIL [$page]: see above"
  exit 1
fi

# A clone's layout, with build/trainer running TRAINER.
cd "$work" || exit 1
mkdir -p build data
for d in configs scripts slurm tests docs bench README.md; do ln -s "$src/$d" "$d"; done
for d in "$src"/data/*; do ln -s "$d" "data/$(basename "$d")"; done
cat >build/trainer <<WRAP
#!/usr/bin/env bash
# build/trainer of the docs tier: $trainer with small step counts (tests/docs/docs.sh).
args=("\$@" --set train.threads=1)
if ! [[ " \$* " =~ train\.steps=([0-9]+) ]] || [ "\${BASH_REMATCH[1]}" -gt 50 ]; then
  steps=$steps
  [[ " \$* " != *checkpoint.resume=* ]] || steps=\$((2 * steps))
  args+=(--set train.steps=\$steps --set train.warmup_steps=2)
fi
exec "$trainer" "\${args[@]}"
WRAP
chmod +x build/trainer

echo "+ the ${page}'s runnable blocks, in $work"
start=$SECONDS
# Each command is printed before it runs (-x); the first one to fail ends the page.
bash -euo pipefail -x "$blocks" 2>&1
rc=$?
if [ "$rc" != 0 ]; then
  echo "FAIL [$page]: a command exited with code $rc (the last \$ [PAGE:LINE] above names its block)"
  exit 1
fi
echo "PASS [$page] in $((SECONDS - start)) s"
