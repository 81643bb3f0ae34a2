#!/usr/bin/env bash
# Builds the release binary here and copies what the GPU machine runs into dist/ (git-ignored),
# so that a device run can carry it: the GPU machine has no Rust toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p devcomm-cli
mkdir -p dist
cp target/release/devcomm dist/devcomm
cp scripts/gpu-run.sh dist/gpu-run.sh
ls -la dist
