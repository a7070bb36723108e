# Helpers of the end-to-end case scripts (tests/e2e/e2e.sh, tests/slurm/slurm.sh); sourced.
# Expects $case_name and $work (a scratch directory); every command's output goes to $out.
# shellcheck disable=SC2154  # case_name and work: set by the script that sources this one
out=$work/out.txt

fail() { echo "FAIL [$case_name]: $*"; echo "----- output -----"; cat "$out"; exit 1; }
run() {  # run CMD...: records output and exit code in $rc
  echo "+ $*"
  "$@" >"$out" 2>&1
  rc=$?
}
expect_rc() { [ "$rc" = "$1" ] || fail "exit code $rc, expected $1"; }
expect_grep() { grep -qE -- "$1" "$out" || fail "output lacks /$1/"; }
expect_no_grep() { ! grep -qE -- "$1" "$out" || fail "output has /$1/"; }
