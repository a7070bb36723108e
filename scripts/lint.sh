#!/usr/bin/env bash
# The lint step (ctest label `lint`, so scripts/test.sh and CI run it): every check runs, each
# failure names the file, and the exit code is 1 if any check failed.
#
#   scripts/lint.sh          # check: clang-format, ruff, shellcheck, function length
#   scripts/lint.sh --fix    # apply clang-format and ruff's safe fixes first, then check
#
# - C++ (.h, .cpp, .cu, .cuh): clang-format 14 with .clang-format (Debian 12's clang-format).
# - Python in scripts/, tests/, bench/: ruff with ruff.toml.
# - Shell (*.sh, and other files whose #! line names bash or sh): shellcheck with .shellcheckrc.
# - No function in src/ longer than 60 lines, as lizard counts them (its "length").
# - Structure (scripts/lint_structure.py): no two files of a folder of src/ include each other,
#   and no options struct repeats a default the schema declares.
# - Commit subjects: at most 72 characters in every commit after 53f09f4 (the history up to it
#   stays as it is); skipped in a shallow clone, where that history is not there to read.
# Files are those git tracks (ruff: those it finds, minus .gitignore's). ruff and lizard come from
# the project's virtualenv (scripts/bootstrap.sh --dev installs them), the rest from scripts/packages.txt.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
source scripts/env.sh

fix=0
case "${1:-}" in
  --fix) fix=1 ;;
  "") ;;
  *) echo "usage: scripts/lint.sh [--fix]" >&2; exit 2 ;;
esac

# The files to check are the ones git tracks: outside a git checkout (an unpacked
# archive) there is no telling sources from build outputs, so the step is skipped (exit 77).
if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "[lint] SKIP: $(pwd) is not a git checkout (the files to check are the ones git tracks)"
  exit 77
fi

readonly kClangFormatMajor=14
readonly kMaxFunctionLines=60

failed=()
say() { printf '[lint] %s\n' "$*"; }
failure() { failed+=("$1"); say "FAIL ($1): ${*:2}"; }

# The files git tracks (a new file counts once `git add`ed), minus those deleted in the work tree.
# Untracked files are left out: a build directory not named in .gitignore holds generated headers.
files() {
  git ls-files -z -- "$@" |
    while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\n' "$f"; done | sort -u
}
tool() {  # tool NAME PATH: PATH if executable, else a failure that says how to get it
  if [ -x "$2" ]; then return 0; fi
  failure "$1" "$2 not found: run scripts/bootstrap.sh --dev (scripts/packages.txt, the virtualenv)"
  return 1
}

# 1. C++ formatting. clang-format lays code out differently from one major version to the next,
# so only the version .clang-format was written for may judge it (CLANG_FORMAT: which binary).
check_cpp() {
  local cf=${CLANG_FORMAT:-}
  [ -n "$cf" ] || cf=$(command -v "clang-format-$kClangFormatMajor" || command -v clang-format)
  [ -n "$cf" ] || cf=/usr/bin/clang-format
  tool clang-format "$cf" || return
  local version
  version=$("$cf" --version | grep -oE 'version [0-9]+' | grep -oE '[0-9]+')
  if [ "$version" != "$kClangFormatMajor" ]; then
    failure clang-format "$cf is version ${version:-unknown}; .clang-format is for version" \
      "$kClangFormatMajor (Debian 12's clang-format; set CLANG_FORMAT to one)"
    return
  fi
  local cpp
  mapfile -t cpp < <(files '*.h' '*.cpp' '*.cu' '*.cuh')
  [ ${#cpp[@]} -gt 0 ] || return 0
  if [ "$fix" = 1 ]; then "$cf" -i --style=file "${cpp[@]}"; fi
  local out
  out=$("$cf" --dry-run -Werror --style=file "${cpp[@]}" 2>&1)
  if [ -n "$out" ]; then
    # The start of clang-format's own report (file:line:column and the code), then each file.
    printf '%s\n' "$out" | head -n 30
    grep -oE '^[^: ]+:[0-9]+:[0-9]+: error' <<<"$out" | cut -d: -f1 | uniq -c |
      while read -r n f; do say "  $f: $n place(s) differ from .clang-format"; done
    failure clang-format "C++ not formatted as .clang-format says (files above);" \
      "'scripts/lint.sh --fix' formats it"
  else
    say "clang-format: ${#cpp[@]} C++ files formatted"
  fi
}

# 2. Python: ruff check (the rules are ruff.toml's).
check_python() {
  local ruff=$TRAINER_VENV/bin/ruff
  tool ruff "$ruff" || return
  if [ "$fix" = 1 ]; then "$ruff" check --quiet --fix --no-cache scripts tests bench; fi
  if ! "$ruff" check --quiet --no-cache --output-format concise scripts tests bench; then
    failure ruff "Python in scripts/, tests/ or bench/ (file:line above; rules in ruff.toml)"
  else
    say "ruff: the Python in scripts/, tests/, bench/ is clean"
  fi
}

# 3. Shell: every *.sh, and every other file (not .py) whose first line names bash or sh.
shell_files() {
  local f
  while IFS= read -r f; do
    case "$f" in
      *.sh) echo "$f" ;;
      *.py) ;;
      *) head -c 128 "$f" | head -n 1 | grep -qE '^#!.*[/ ](ba)?sh( |$)' && echo "$f" ;;
    esac
  done < <(files)
}
check_shell() {
  tool shellcheck "$(command -v shellcheck || echo /usr/bin/shellcheck)" || return
  local sh
  mapfile -t sh < <(shell_files)
  [ ${#sh[@]} -gt 0 ] || return 0
  if ! shellcheck --format gcc "${sh[@]}"; then
    failure shellcheck "shell scripts (file:line above; settings in .shellcheckrc)"
  else
    say "shellcheck: ${#sh[@]} shell scripts clean"
  fi
}

# 4. Function length in src/: lizard's "length" counts every line from the signature to the
# closing brace. -C and -a are set past any real function so that only the length is judged.
check_function_length() {
  local lizard=$TRAINER_VENV/bin/lizard
  tool lizard "$lizard" || return
  local out
  out=$("$lizard" -L "$kMaxFunctionLines" -C 1000 -a 100 -w src 2>&1)
  if [ -n "$out" ]; then
    # lizard -w: "FILE:LINE: warning: NAME has N NLOC, N CCN, N token, N PARAM, N length, ..."
    local pattern='^([^:]+:[0-9]+): warning: (.+) has .* ([0-9]+) length.*'
    if grep -qE "$pattern" <<<"$out"; then
      sed -nE "s/$pattern/  \\1: \\2 is \\3 lines long/p" <<<"$out" |
        while IFS= read -r line; do say "$line"; done
    else
      printf '%s\n' "$out"  # not lizard's warning format: show it as it is
    fi
    failure lizard "function(s) in src/ longer than $kMaxFunctionLines lines (split them)"
  else
    say "lizard: no function in src/ over $kMaxFunctionLines lines"
  fi
}

# 5. Structure rules no compiler checks (scripts/lint_structure.py says each): include pairs
# inside a folder, defaults written beside the schema's, no anonymous namespace in a test file
# (the unity batches), and every docs/DESIGN.md section cited is a heading of it.
check_structure() {
  local src tests rule
  mapfile -t src < <(files 'src/*.h' 'src/*.cpp')
  for rule in includes defaults names; do
    if ! python3 scripts/lint_structure.py "$rule" "${src[@]}"; then
      failure "$rule" "src/ (file:line above; the rule in scripts/lint_structure.py)"
    else
      say "$rule: clean"
    fi
  done
  mapfile -t tests < <(files 'tests/unit/*.cpp' 'tests/mpi/*.cpp' 'tests/gpu/*.cpp')
  if ! python3 scripts/lint_structure.py unity "${tests[@]}"; then
    failure unity "tests/ (file:line above; the rule in scripts/lint_structure.py)"
  else
    say "unity: clean"
  fi
  # A test file's name is its suites' (docs/DESIGN.md, "Tests and benchmarks"): one file a name
  # across the tiers (an mpi tier's own is NAME_mpi_test.cpp).
  local twice
  twice=$(printf '%s\n' "${tests[@]##*/}" | sort | uniq -d)
  if [ -n "$twice" ]; then
    printf '%s\n' "$twice"
    failure test-names "test files of one name in two tiers (above): rename the mpi tier's NAME_mpi_test.cpp"
  else
    say "test names: no test file name in two tiers"
  fi
  # Rule 5 of the layers (docs/DESIGN.md, "Layers"): the launcher reaches models through their
  # interfaces and capabilities (models::as<...>), never by casting to a concrete model type.
  local casts
  casts=$(git grep -n -E 'dynamic_cast<[^>]*models::' -- 'src/launcher/*' || true)
  if [ -n "$casts" ]; then
    printf '%s\n' "$casts"
    failure model-casts "src/launcher casts to a model type (above): use a capability (models/capabilities.h)"
  else
    say "model casts: none in src/launcher"
  fi
  local cited
  mapfile -t cited < <(files 'src/*' 'tests/*' 'scripts/*' 'bench/*' 'cmake/*' 'configs/*' \
    'slurm/*' '.ci/*' '*.md' '*CMakeLists.txt')
  if ! python3 scripts/lint_structure.py citations "${cited[@]}"; then
    failure citations "a DESIGN.md section cited that is not a heading (file:line above)"
  else
    say "citations: every docs/DESIGN.md section cited is a heading"
  fi
  if ! python3 scripts/lint_structure.py contents; then
    failure contents "docs/DESIGN.md's contents list (the list it should be is above)"
  else
    say "contents: docs/DESIGN.md's contents list names its headings"
  fi
}

# 6. Commit subjects: what changed in at most 72 characters, the details in the body (Git's
# SubmittingPatches). Every commit after kSubjectsFrom, the last commit with longer subjects, is
# held to it; the history up to it stays as it is. It needs the history: in a shallow clone (CI's
# default checkout depth), or one where kSubjectsFrom is not an ancestor of HEAD, it says why and
# checks nothing.
readonly kSubjectsFrom=53f09f4
readonly kMaxSubject=72
check_commit_subjects() {
  if [ "$(git rev-parse --is-shallow-repository 2>/dev/null)" = true ]; then
    say "commit subjects: SKIP: a shallow clone (git fetch --unshallow gives the history)"
    return 0
  fi
  if ! git merge-base --is-ancestor "$kSubjectsFrom" HEAD 2>/dev/null; then
    say "commit subjects: SKIP: $kSubjectsFrom is not an ancestor of HEAD (another history)"
    return 0
  fi
  local LC_ALL=C.UTF-8  # ${#subject} counts characters, not bytes
  local hash subject n=0 long=0
  while IFS=' ' read -r hash subject; do
    n=$((n + 1))
    if [ "${#subject}" -gt "$kMaxSubject" ]; then
      long=$((long + 1))
      say "  $hash: subject of ${#subject} characters (at most $kMaxSubject): $subject"
    fi
  done < <(git log --format='%h %s' "$kSubjectsFrom..HEAD")
  if [ "$long" -gt 0 ]; then
    failure subjects "$long of $n commit(s) after $kSubjectsFrom have a subject over" \
      "$kMaxSubject characters (above): say what changed in the subject, the rest in the body" \
      "(git commit --amend, or git rebase -i for older ones)"
  else
    say "commit subjects: the $n commit(s) after $kSubjectsFrom are within $kMaxSubject characters"
  fi
}

check_cpp
check_python
check_shell
check_function_length
check_structure
check_commit_subjects

if [ ${#failed[@]} -gt 0 ]; then
  say "failed: ${failed[*]}"
  exit 1
fi
say "all clean"
