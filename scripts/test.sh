#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh), then runs every test: C++ (ctest) and Python (pytest).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
scripts/setup.sh

echo "== C++ tests (ctest)"
ctest --test-dir build/native --output-on-failure -j "$(nproc)" --timeout 600

echo "== Python tests (pytest)"
.venv/bin/python -m pytest -q -ra "$@"
