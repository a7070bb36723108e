#!/usr/bin/env bash
# The quick start: bootstrap, then a small GPT learns byte-level English (configs/quickstart.yaml)
# on 2 CPU ranks in a few minutes, with a sample of its writing before and after training.
# Arguments go to every trainer command (e.g. --set train.steps=200). NP ranks (default 2).
# It installs and builds only what that uses (scripts/bootstrap.sh without --dev: the Debian
# packages, torch for LibTorch, the trainer binary); scripts/test.sh adds the Python packages and
# tools of the tests and the lint (bootstrap.sh --dev) and builds the tests and benchmarks.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh trainer
source scripts/env.sh
config=configs/quickstart.yaml
prompt="The parser"
sample() {  # greedy would repeat itself; a fixed seed gives the same text every run; 54 new bytes fill the context (64)
  "$BUILD_DIR/trainer" --config "$config" "$@" --generate "$prompt" --max-new-tokens 54 \
    --temperature 0.8 --top-k 40 --seed 7
}
echo "== A sample before training (untrained weights):"
sample "$@" --set checkpoint.dir=
echo
echo "== Training on ${NP:-2} CPU ranks:"
mpirun -np "${NP:-2}" "$BUILD_DIR/trainer" --config "$config" --set checkpoint.resume= "$@"
echo
echo "== A sample after training:"
sample "$@"
echo
echo "Checkpoint: runs/quickstart/final.safetensors   metrics: runs/quickstart/metrics.jsonl"
echo "Plot the metrics: scripts/bootstrap.sh --dev (once: matplotlib and the other Python tools), then"
echo "  scripts/plot_metrics.py runs/quickstart/metrics.jsonl"
echo "Write more: build/trainer --config $config --generate \"Your prompt\""
echo "As a Hugging Face model: build/trainer --config $config --export-hf runs/quickstart/hf"
