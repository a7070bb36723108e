#!/usr/bin/env bash
# Installs what is missing (Debian packages, the LibTorch wheel in a reusable virtualenv),
# configures and builds. Idempotent: a second run with nothing changed takes seconds.
#
#   scripts/bootstrap.sh              # Release build in ./build
#   Torch_DIR=/opt/libtorch/share/cmake/Torch scripts/bootstrap.sh   # use an existing LibTorch
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

log() { printf '[bootstrap] %s\n' "$*"; }

# 1. Debian packages.
apt_packages=(build-essential cmake ninja-build ccache pkg-config python3 python3-venv procps
  openmpi-bin libopenmpi-dev libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev
  nlohmann-json3-dev libpng-dev libgtest-dev libgmock-dev libbenchmark-dev
  libprotobuf-dev protobuf-compiler libboost-dev bsdutils)
install_debian_packages "${apt_packages[@]}"

# 2. LibTorch: a user-provided Torch_DIR wins; otherwise the PyPI wheel in a cached virtualenv.
if [ -n "${Torch_DIR:-}" ]; then
  log "using LibTorch from Torch_DIR=$Torch_DIR"
  torch_prefix=""
else
  if ! "$TRAINER_VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
    log "installing torch==$TORCH_VERSION into $TRAINER_VENV (one time, a few minutes)"
    python3 -m venv "$TRAINER_VENV"
    "$TRAINER_VENV/bin/pip" install --quiet --disable-pip-version-check "torch==$TORCH_VERSION"
  fi
  # What the PyTorch reference tests, the data scripts and the benchmarks' peers import, and
  # TensorBoard's event reader (the e2e test of log.tensorboard).
  if ! "$TRAINER_VENV/bin/python" -c "import safetensors, numpy, PIL, matplotlib, tensorboard" 2>/dev/null; then
    log "installing safetensors, numpy, pillow, matplotlib, tensorboard into $TRAINER_VENV"
    "$TRAINER_VENV/bin/pip" install --quiet --disable-pip-version-check safetensors numpy pillow matplotlib tensorboard
  fi
  # Hugging Face transformers: the GPT-2 import/export and generation tests compare with it
  # (offline: the tests build random models; nothing is downloaded at test time).
  if ! HF_HUB_OFFLINE=1 "$TRAINER_VENV/bin/python" -c "import transformers" 2>/dev/null; then
    log "installing transformers into $TRAINER_VENV"
    "$TRAINER_VENV/bin/pip" install --quiet --disable-pip-version-check transformers
  fi
  torch_prefix=$("$TRAINER_VENV/bin/python" -c "import torch.utils; print(torch.utils.cmake_prefix_path)" 2>/dev/null)
fi

# 3. Configure once (CMake re-runs itself when CMakeLists change), then build incrementally.
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  log "configuring $BUILD_DIR"
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" \
    ${torch_prefix:+-DCMAKE_PREFIX_PATH="$torch_prefix"} \
    ${Torch_DIR:+-DTorch_DIR="$Torch_DIR"} >/dev/null
fi
log "building $BUILD_DIR"
cmake --build "$BUILD_DIR" -- -j"${BUILD_JOBS:-$(nproc)}"
