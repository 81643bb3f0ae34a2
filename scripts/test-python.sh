#!/usr/bin/env bash
# Builds the devcomm Python package (python/, PyO3 + maturin) and runs its tests that need
# neither a GPU nor torch. Called by scripts/test.sh; works from a fresh clone.
#
# maturin and pytest come from PyPI into .tools/py (git-ignored); the wheel is built into
# target/python-wheels and installed into target/python-site, which the tests import from.
# GPU tests (python/tests/gpu) run on a GPU machine: docs/PYTHON.md, "Tests".
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

tools="$root/.tools/py"
if [ ! -x "$tools/bin/maturin" ] || [ ! -d "$tools/pytest" ]; then
  echo "== installing maturin and pytest into $tools"
  python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
    --target "$tools" 'maturin>=1.5,<2' 'pytest>=7'
fi
export PYTHONPATH="$tools${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$tools/bin:$PATH"
# The extension crate builds in the repository's target folder, beside the workspace.
export CARGO_TARGET_DIR="$root/target"

echo "== cargo fmt --check (python/)"
(cd python && cargo fmt -- --check)
echo "== cargo clippy (python/)"
(cd python && cargo clippy --quiet --all-targets -- -D warnings)

wheels="$root/target/python-wheels"
site="$root/target/python-site"
rm -rf "$wheels" "$site"
echo "== maturin build"
(cd python && maturin build --quiet --out "$wheels")
wheel=$(ls "$wheels"/devcomm-*.whl)
python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps --target "$site" "$wheel"

echo "== pytest (no GPU, no torch)"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
# -p no:cacheprovider: nothing written into the checkout.
(cd "$root/target" && PYTHONPATH="$site:$PYTHONPATH" python3 -m pytest -p no:cacheprovider -q \
  "$root/python/tests" --ignore="$root/python/tests/gpu" 2>&1) | tee "$log"
rc=${PIPESTATUS[0]}
set -e
# pytest exits 5 when it collected no test: a failure here, never a pass.
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no test" >&2
  exit 1
fi
exit "$rc"
