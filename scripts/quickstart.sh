#!/usr/bin/env bash
# Bootstrap, then train the small MLP on synthetic data on 2 CPU ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
source scripts/env.sh
exec mpirun -np "${NP:-2}" "$BUILD_DIR/trainer" --config configs/quickstart.yaml "$@"
