#!/usr/bin/env bash
# Installs what is missing (Debian packages, the LibTorch wheel in a reusable virtualenv),
# configures and builds. Idempotent: a second run with nothing changed takes seconds.
#
#   scripts/bootstrap.sh              # Release build in ./build: everything (trainer, tests, benches)
#   scripts/bootstrap.sh trainer      # only the given targets (scripts/quickstart.sh: the binary)
#   scripts/bootstrap.sh --dev [TARGET...]   # also what the Python scripts, the tests and the lint
#                                            # use (scripts/test.sh; see "3. The tools" below)
#   Torch_DIR=/opt/libtorch/share/cmake/Torch scripts/bootstrap.sh   # use an existing LibTorch
#   TRAINER_WERROR=ON scripts/bootstrap.sh   # warnings as errors (on by itself when CI=true)
#
# Without --dev it installs only what building and running the trainer needs: the Debian packages
# and torch (LibTorch; the quick start needs nothing else). --dev adds, pinned where the tests
# compare against them: safetensors, numpy, pillow, matplotlib, tensorboard, tiktoken, tqdm,
# transformers, tokenizers, pyarrow, zstandard, ruff, lizard, and GPT-2's BPE ranks in the cache.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

dev=0
if [ "${1:-}" = --dev ]; then
  dev=1
  shift
fi

log() { printf '[bootstrap] %s\n' "$*"; }

# 1. Debian packages: those scripts/packages.txt marks `host` (one list, shared with device-deps.sh).
mapfile -t apt_packages < <(debian_packages host)
install_debian_packages "${apt_packages[@]}"

# 2. LibTorch: a user-provided Torch_DIR wins; otherwise the PyPI wheel in a cached virtualenv.
if [ -n "${Torch_DIR:-}" ]; then
  log "using LibTorch from Torch_DIR=$Torch_DIR"
  torch_prefix=""
else
  # The installed version and where its CMake files are, read without importing torch: an import
  # takes seconds (tens on a busy machine), and only the C++ library is used here.
  torch_query() {
    "$TRAINER_VENV/bin/python" - "$1" 2>/dev/null <<'PY'
import importlib.metadata, importlib.util, os, sys
if sys.argv[1] == "version":
    print(importlib.metadata.version("torch").split("+")[0])
else:
    print(os.path.join(importlib.util.find_spec("torch").submodule_search_locations[0], "share", "cmake"))
PY
  }
  if [ "$(torch_query version)" != "$TORCH_VERSION" ]; then
    log "installing torch==$TORCH_VERSION into $TRAINER_VENV (one time, a few minutes)"
    python3 -m venv "$TRAINER_VENV"
    # --no-compile: no .pyc for torch's thousands of modules up front (LibTorch is what the build
    # uses); Python compiles what it imports when it first imports it.
    "$TRAINER_VENV/bin/pip" install --quiet --disable-pip-version-check --no-compile \
      "torch==$TORCH_VERSION"
  fi
  torch_prefix=$(torch_query cmake)
fi

# 3. The tools (--dev): what the Python scripts (tokenize_text.py, plot_metrics.py, make_*.py),
# the tests and the lint use, in the same virtualenv (created here when Torch_DIR brought LibTorch).
install_dev_tools() {
  local pip=("$TRAINER_VENV/bin/pip" install --quiet --disable-pip-version-check)
  [ -x "$TRAINER_VENV/bin/python" ] || python3 -m venv "$TRAINER_VENV"
  # What the PyTorch reference tests, the data scripts and the benchmarks' peers import, and
  # TensorBoard's event reader (the e2e test of log.tensorboard).
  if ! "$TRAINER_VENV/bin/python" -c "import safetensors, numpy, PIL, matplotlib, tensorboard" 2>/dev/null; then
    log "installing safetensors, numpy, pillow, matplotlib, tensorboard into $TRAINER_VENV"
    "${pip[@]}" safetensors numpy pillow matplotlib tensorboard
  fi
  local TIKTOKEN_VERSION=0.14.0
  # The GPT-2 tokenizer of scripts/tokenize_text.py (pinned: its ids are what the tests compare
  # the C++ tokenizer with) and its progress bar.
  if ! "$TRAINER_VENV/bin/python" -c "import tiktoken, tqdm, sys; sys.exit(tiktoken.__version__ != '$TIKTOKEN_VERSION')" 2>/dev/null; then
    log "installing tiktoken==$TIKTOKEN_VERSION, tqdm into $TRAINER_VENV"
    "${pip[@]}" "tiktoken==$TIKTOKEN_VERSION" tqdm
  fi
  # Hugging Face transformers: the GPT-2 import/export and generation tests compare with it
  # (offline: the tests build random models; nothing is downloaded at test time). tokenizers
  # (which transformers requires, in a range): scripts/tokenize_text.py --tokenizer, and the ids
  # the C++ tokenizer.json reader is tested against -- pinned, as tiktoken is.
  # jinja2 renders chat templates (scripts/tokenize_text.py --chat, through transformers'
  # apply_chat_template); the torch wheel brings some version of it: pinned here.
  local TRANSFORMERS_VERSION=5.23.0 TOKENIZERS_VERSION=0.23.3 JINJA2_VERSION=3.1.6
  if ! HF_HUB_OFFLINE=1 "$TRAINER_VENV/bin/python" -c "import transformers, tokenizers, jinja2, sys; sys.exit(transformers.__version__ != '$TRANSFORMERS_VERSION' or tokenizers.__version__ != '$TOKENIZERS_VERSION' or jinja2.__version__ != '$JINJA2_VERSION')" 2>/dev/null; then
    log "installing transformers==$TRANSFORMERS_VERSION, tokenizers==$TOKENIZERS_VERSION, jinja2==$JINJA2_VERSION into $TRAINER_VENV"
    "${pip[@]}" "transformers==$TRANSFORMERS_VERSION" "tokenizers==$TOKENIZERS_VERSION" "jinja2==$JINJA2_VERSION"
  fi
  # The lint step's Python tools (scripts/lint.sh), pinned: another version may judge the same
  # code differently.
  local RUFF_VERSION=0.17.6 LIZARD_VERSION=1.24.3
  if [ "$("$TRAINER_VENV/bin/ruff" --version 2>/dev/null)" != "ruff $RUFF_VERSION" ] ||
     [ "$("$TRAINER_VENV/bin/lizard" --version 2>/dev/null)" != "$LIZARD_VERSION" ]; then
    log "installing ruff==$RUFF_VERSION, lizard==$LIZARD_VERSION into $TRAINER_VENV"
    "${pip[@]}" "ruff==$RUFF_VERSION" "lizard==$LIZARD_VERSION"
  fi
  # PEFT: the LoRA tests load the trainer's --export-peft adapters with PeftModel.from_pretrained
  # and compare logits and merge_and_unload() (tests/hf/lora_peft.py), and write the adapters
  # model.lora_init_from reads. Pinned, with accelerate (which it requires).
  local PEFT_VERSION=0.21.2 ACCELERATE_VERSION=1.15.0
  if ! "$TRAINER_VENV/bin/python" -c "import peft, accelerate, sys; sys.exit(peft.__version__ != '$PEFT_VERSION' or accelerate.__version__ != '$ACCELERATE_VERSION')" 2>/dev/null; then
    log "installing peft==$PEFT_VERSION, accelerate==$ACCELERATE_VERSION into $TRAINER_VENV"
    "${pip[@]}" "peft==$PEFT_VERSION" "accelerate==$ACCELERATE_VERSION"
  fi
  # The input formats of scripts/tokenize_text.py beside plain text and JSON Lines: Parquet (the
  # Hub's datasets, FineWeb-Edu's shards; read a row group at a time) and Zstandard-compressed JSON
  # Lines (.jsonl.zst; .jsonl.gz needs only the standard library). Pinned: the tests compare their
  # shards with those of the same rows as plain JSON Lines.
  local PYARROW_VERSION=26.0.1 ZSTANDARD_VERSION=0.25.0
  if ! "$TRAINER_VENV/bin/python" -c "import pyarrow, zstandard, sys; sys.exit(pyarrow.__version__ != '$PYARROW_VERSION' or zstandard.__version__ != '$ZSTANDARD_VERSION')" 2>/dev/null; then
    log "installing pyarrow==$PYARROW_VERSION, zstandard==$ZSTANDARD_VERSION into $TRAINER_VENV"
    "${pip[@]}" "pyarrow==$PYARROW_VERSION" "zstandard==$ZSTANDARD_VERSION"
  fi
  fetch_gpt2_ranks
}

# GPT-2's BPE ranks in tiktoken's format (scripts/tokenize_text.py --encoding gpt2, and the
# trainer's gpt2 tokenizer: data.tokenizer gpt2, --generate on GPT-2 ids):
# whisper/assets/gpt2.tiktoken from the openai-whisper sdist on PyPI, fetched once into the shared
# cache and checked against a pinned SHA-256 (the same bytes as tiktoken's r50k_base.tiktoken).
fetch_gpt2_ranks() {
  local WHISPER_VERSION=20250625
  local GPT2_RANKS_SHA256=306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930
  local gpt2_ranks=$TRAINER_CACHE/gpt2.tiktoken tmp member
  echo "$GPT2_RANKS_SHA256  $gpt2_ranks" | sha256sum --check --status 2>/dev/null && return 0
  log "fetching GPT-2's BPE ranks (openai-whisper==$WHISPER_VERSION sdist) into $gpt2_ranks"
  tmp=$(mktemp -d)
  "$TRAINER_VENV/bin/pip" download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
    "openai-whisper==$WHISPER_VERSION" -d "$tmp"
  member=openai_whisper-$WHISPER_VERSION/whisper/assets/gpt2.tiktoken
  tar --no-same-owner -xzf "$tmp/openai_whisper-$WHISPER_VERSION.tar.gz" -C "$tmp" "$member"
  if ! echo "$GPT2_RANKS_SHA256  $tmp/$member" | sha256sum --check --status; then
    log "error: $member in openai-whisper==$WHISPER_VERSION does not have SHA-256 $GPT2_RANKS_SHA256"
    rm -rf "$tmp"
    exit 1
  fi
  mkdir -p "$TRAINER_CACHE"
  mv "$tmp/$member" "$gpt2_ranks.$$" && mv "$gpt2_ranks.$$" "$gpt2_ranks"  # whole, for concurrent clones
  rm -rf "$tmp"
}
[ "$dev" = 0 ] || install_dev_tools

# 4. Configure once (CMake re-runs itself when CMakeLists change), then build incrementally.
# Warnings as errors (TRAINER_WERROR, CMakeLists.txt) in CI (CI=true) or when asked
# (TRAINER_WERROR=ON or OFF); a build directory configured before is set to it too.
werror=${TRAINER_WERROR:-}
if [ -z "$werror" ] && [ "${CI:-}" = true ]; then werror=ON; fi
# A build directory configured before the CUDA toolkit was installed stays CPU-only: CMake keeps
# what it found then. Its cache has no NCCL_LIBRARY entry exactly when the toolkit was not found
# (cmake/TrainerDeps.cmake looks for NCCL only with CUDA::cudart), so a toolkit here now means
# configuring afresh. Once per toolkit: where CUDA is still not found (a CPU-only LibTorch from
# Torch_DIR), the marker file keeps the next runs from configuring again.
nvcc=$(command -v nvcc || true)
[ -n "$nvcc" ] || [ ! -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] || nvcc=${CUDA_HOME:-/usr/local/cuda}/bin/nvcc
cuda_marker=$BUILD_DIR/.reconfigured-for-cuda
if [ -n "$nvcc" ] && [ -f "$BUILD_DIR/CMakeCache.txt" ] &&
   ! grep -q '^NCCL_LIBRARY:' "$BUILD_DIR/CMakeCache.txt" && [ "$(cat "$cuda_marker" 2>/dev/null)" != "$nvcc" ]; then
  log "$BUILD_DIR was configured without CUDA, and the CUDA toolkit is here now ($nvcc): configuring it again"
  BUILD_TYPE=${BUILD_TYPE:-$(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$BUILD_DIR/CMakeCache.txt")}
  rm -rf "$BUILD_DIR/CMakeCache.txt" "$BUILD_DIR/CMakeFiles" "$BUILD_DIR/build.ninja"
  echo "$nvcc" >"$cuda_marker"
  reconfigured_for_cuda=1
fi
# The sanitizer builds (scripts/sanitize.sh, CMakeLists.txt) set TRAINER_SANITIZE and
# TRAINER_TEST_TIMEOUT_SCALE the same way, in build directories of their own.
options=(${werror:+-DTRAINER_WERROR="$werror"} ${TRAINER_SANITIZE:+-DTRAINER_SANITIZE="$TRAINER_SANITIZE"}
  ${TRAINER_TEST_TIMEOUT_SCALE:+-DTRAINER_TEST_TIMEOUT_SCALE="$TRAINER_TEST_TIMEOUT_SCALE"})
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  log "configuring $BUILD_DIR${options[*]:+ (${options[*]})}"
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="${BUILD_TYPE:-Release}" \
    ${torch_prefix:+-DCMAKE_PREFIX_PATH="$torch_prefix"} \
    ${Torch_DIR:+-DTorch_DIR="$Torch_DIR"} "${options[@]}" >/dev/null
elif [ ${#options[@]} -gt 0 ]; then
  log "${options[*]} in $BUILD_DIR"
  cmake -S . -B "$BUILD_DIR" "${options[@]}" >/dev/null
fi
if [ -n "${reconfigured_for_cuda:-}" ] && ! grep -q '^NCCL_LIBRARY:' "$BUILD_DIR/CMakeCache.txt"; then
  log "warning: CMake still found no CUDA for $BUILD_DIR (a CPU-only LibTorch?): the build is CPU only"
fi
log "building ${*:-everything} in $BUILD_DIR"
cmake --build "$BUILD_DIR" ${1:+--target "$@"} -- -j"${BUILD_JOBS:-$(nproc)}"
