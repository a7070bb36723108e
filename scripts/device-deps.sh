#!/usr/bin/env bash
# Here (a Debian 12 machine with network): downloads the Debian packages the trainer builds and
# runs against, for a machine that has the CUDA toolkit and PyTorch but no network and none of
# them (the GPU machines lent through the `device` tool). They land in .device/debs (ignored by
# .gitignore); carry `.device` to that machine and run scripts/device-check.sh there.
# Only libraries and headers: compilers, libc and the like are the machine's own.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .device/debs
source scripts/env.sh
# The packages scripts/packages.txt marks `device` (one list, shared with bootstrap.sh).
mapfile -t packages < <(debian_packages device)
# barkeep's header (the progress bar), which cmake/TrainerDeps.cmake otherwise fetches from PyPI.
barkeep=.device/barkeep-0.1.6.tar.gz
[ -f "$barkeep" ] || curl -fsSL -o "$barkeep" \
  https://files.pythonhosted.org/packages/86/6e/7d04a6cef6174ba7aa0d4e99eabd11c82f55d7454bb08e270c6ca2699aa4/barkeep-0.1.6.tar.gz
cd .device/debs
rm -f ./*.deb
apt-get download "${packages[@]}" >/dev/null
echo "[device-deps] $(find . -maxdepth 1 -name '*.deb' | wc -l) packages, $(du -sh . | cut -f1) in .device/debs; $barkeep"
