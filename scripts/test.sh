#!/usr/bin/env bash
# Bootstrap, then the whole test suite. Extra arguments go to ctest (e.g. -L unit).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh --dev  # the build, and the Python packages and tools the tests and the lint use
# The `slurm` tests run jobs on a real SLURM on this machine (one node, and two nodes in namespaces
# of their own); as root, scripts/local-slurm.sh installs and starts it here (Debian packages
# slurm-wlm, munge, libpmix-dev; /etc/slurm/slurm.conf, /var/lib/slurm, /var/log/slurm; the
# daemons munged, slurmctld and three slurmd). TRAINER_SKIP_SLURM=1 leaves the machine alone. The
# tests are reported as skipped where no SLURM answers (the two-node ones also where the
# namespaces are missing).
if [ "${TRAINER_SKIP_SLURM:-0}" = 1 ]; then
  echo "[test] TRAINER_SKIP_SLURM=1: no local SLURM is installed or started"
elif [ "$(id -u)" = 0 ]; then
  scripts/local-slurm.sh || echo "[test] no local SLURM: the slurm tests will be skipped"
fi
source scripts/env.sh
# As many tests at once as there are cores (TEST_JOBS=1: one at a time): many wait on Python's
# imports, mpirun's start or SLURM's timers more than they compute. A test states what it needs
# (PROCESSORS: an mpi test's ranks; RESOURCE_LOCK slurm: the one local cluster).
exec ctest --test-dir "$BUILD_DIR" --output-on-failure -j "${TEST_JOBS:-$(nproc)}" "$@"
