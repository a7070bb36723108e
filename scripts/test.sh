#!/usr/bin/env bash
# Bootstrap, then the whole test suite. Extra arguments go to ctest (e.g. -L unit).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
source scripts/env.sh
exec ctest --test-dir "$BUILD_DIR" --output-on-failure "$@"
