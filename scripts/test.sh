#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh), then runs every test: C++ (ctest) and Python (pytest).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
scripts/setup.sh

echo "== C++ tests (ctest)"
ctest --test-dir build/native --output-on-failure -j "$(nproc)" --timeout 600

# The build and the C++ tests must also pass without CUDA (ZS_WITH_CUDA=OFF), which is what a
# machine without nvcc builds; when nvcc is here, build that variant too (C++ only).
if [ "$(grep -s '^ZS_WITH_CUDA:BOOL=' build/native/CMakeCache.txt | cut -d= -f2)" = "ON" ]; then
  echo "== C++ tests, ZS_WITH_CUDA=OFF variant (build/nocuda)"
  cmake -S . -B build/nocuda -G Ninja -DZS_WITH_CUDA=OFF -DZS_BUILD_PYTHON=OFF \
    -DZS_BUILD_TESTS=ON >/dev/null
  cmake --build build/nocuda -j "$(nproc)" >/dev/null
  ctest --test-dir build/nocuda --output-on-failure -j "$(nproc)" --timeout 600
fi

echo "== Python tests (pytest)"
.venv/bin/python -m pytest -q -ra "$@"
