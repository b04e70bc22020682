#!/usr/bin/env bash
# Developer build without pip: configures build/dev with plain CMake (tests on) and drops
# zerostream/_C*.so next to the sources, so `PYTHONPATH=python .venv/bin/python -m pytest`
# runs against the working tree. Needs scripts/setup.sh to have run once (for .venv).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
py=${ZS_DEV_PYTHON:-$root/.venv/bin/python}
cmake -S . -B build/dev -G Ninja -DZS_BUILD_TESTS=ON -DPython_EXECUTABLE="$py" \
  -Dpybind11_DIR="$("$py" -m pybind11 --cmakedir)" "$@" >/dev/null
cmake --build build/dev -j "${ZS_JOBS:-2}"
