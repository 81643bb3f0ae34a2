#!/usr/bin/env bash
# Builds the release binary here and copies what the GPU machine runs into dist/ (git-ignored),
# so that a device run can carry it: the GPU machine has no Rust toolchain.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p devcomm-cli
cargo build --release -p devcomm --examples
mkdir -p dist
cp target/release/devcomm dist/devcomm
cp target/release/examples/transpose_all_to_all target/release/examples/fp8_all_to_all dist/
cp scripts/gpu-run.sh dist/gpu-run.sh
strip dist/devcomm dist/transpose_all_to_all dist/fp8_all_to_all
ls -la dist
