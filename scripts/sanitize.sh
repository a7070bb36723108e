#!/usr/bin/env bash
# The unit and mpi tiers under the sanitizers, each in a build directory of its own (docs/DESIGN.md,
# "Tests and benchmarks"; CMakeLists.txt, TRAINER_SANITIZE):
#
#   scripts/sanitize.sh address [CTEST_ARGS...]  # build-asan: AddressSanitizer, LeakSanitizer, UBSan
#   scripts/sanitize.sh thread [CTEST_ARGS...]   # build-tsan: ThreadSanitizer
#
# Extra arguments go to ctest (e.g. -R loader). BUILD_JOBS and TEST_JOBS as for scripts/test.sh.
# Only the project's code is instrumented: LibTorch, Open MPI and the system's libraries are not,
# and scripts/sanitizers/*.supp name what of theirs is left out, each entry a library outside the
# project, with the reason beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  # Sanitized code runs 2 to 3 times slower under ASan, 5 to 15 under TSan: the tests' TIMEOUTs
  # are scaled (tests/CMakeLists.txt, trainer_scale_timeouts) rather than each test's.
  address) sanitize=address,undefined build=build-asan scale=4 ;;
  thread) sanitize=thread build=build-tsan scale=10 ;;
  *)
    echo "usage: scripts/sanitize.sh address|thread [CTEST_ARGS...]" >&2
    exit 2
    ;;
esac
shift
supp=$PWD/scripts/sanitizers
# The test binaries of the unit and mpi tiers (tests/unit, tests/mpi); not the trainer binary,
# which only the e2e tier runs.
targets=(unit_tests hf_gpt2_tests llama_tests llama_kin_tests preference_tests mpi_tests)
# Warnings are not errors here, in CI either: GCC warns of false -Wmaybe-uninitialized in
# libstdc++'s headers (<regex>'s std::function) only under -fsanitize=address. The normal build
# keeps the project warning-free.
BUILD_DIR=$build TRAINER_SANITIZE=$sanitize TRAINER_TEST_TIMEOUT_SCALE=$scale TRAINER_WERROR=OFF \
  scripts/bootstrap.sh --dev "${targets[@]}"
# The TensorBoard records' test exists where protobuf was found (tests/unit/CMakeLists.txt).
if ninja -C "$build" -t query tensorboard_tests >/dev/null 2>&1; then
  cmake --build "$build" --target tensorboard_tests -- -j"${BUILD_JOBS:-$(nproc)}"
fi
source scripts/env.sh

# The reports go to stderr, which ctest shows for a failed test; a report fails its test: ASan
# and UBSan stop the process at the first (-fno-sanitize-recover, CMakeLists.txt), TSan exits 66
# at the end of a process that had one. mpirun hands the environment to its ranks. The Python
# the tests start (the PyTorch references, the fork server's children) is not instrumented and
# gets no LD_PRELOAD: the sanitizer runtime is linked into the test binaries alone.
if [ "$sanitize" = thread ]; then
  # report_signal_unsafe=0: Open MPI's and LibTorch's signal handlers are theirs to judge.
  export TSAN_OPTIONS="suppressions=$supp/tsan.supp:report_signal_unsafe=0:second_deadlock_stack=1"
  # LibTorch's intra-op threads come from its own libgomp, whose barriers TSan cannot see: every
  # access of an at::parallel_for body (models/layers.cpp) after the region would look racy. One
  # thread runs the body in the caller. Our own threads (the loader's workers, the MPI progress
  # thread, the checkpoint writer) are all still there.
  export OMP_NUM_THREADS=1
else
  # detect_container_overflow=0: LibTorch's std::vector and std::string code is not instrumented,
  # so the container annotations of ours and theirs disagree on the same objects (false reports).
  # fast_unwind_on_malloc=0: Open MPI's libraries have no frame pointers, so the fast unwinder
  # stops at their first frame, most often in an MCA component unloaded by exit; the slow one
  # reaches libmpi.so, which lsan.supp names.
  export ASAN_OPTIONS="detect_container_overflow=0:fast_unwind_on_malloc=0:check_initialization_order=1:strict_init_order=1"
  export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="suppressions=$supp/ubsan.supp:print_stacktrace=1"
fi
# The tests of scripts/ (*_py) run Python alone, with nothing of ours to instrument.
exec ctest --test-dir "$build" --output-on-failure -j "${TEST_JOBS:-$(nproc)}" -L 'unit|mpi' \
  -E '_py$' "$@"
