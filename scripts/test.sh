#!/usr/bin/env bash
# Bootstrap, then the whole test suite. Extra arguments go to ctest (e.g. -L unit).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
# The `slurm` tests run jobs on a real SLURM on this machine (one node, and two nodes in namespaces
# of their own); it is installed and started here where that is possible (root), and those tests
# are reported as skipped where it is not (the two-node ones also where the namespaces are not).
if [ "$(id -u)" = 0 ]; then
  scripts/local-slurm.sh || echo "[test] no local SLURM: the slurm tests will be skipped"
fi
source scripts/env.sh
exec ctest --test-dir "$BUILD_DIR" --output-on-failure "$@"
