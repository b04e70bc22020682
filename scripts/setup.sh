#!/usr/bin/env bash
# Sets up everything zerostream needs on a fresh Debian machine, idempotently:
#   1. Debian packages (apt), 2. .venv with pinned Python packages, 3. build + install
#   zerostream (and its C++ tests) into .venv. Each step is skipped when nothing changed.
# Used by scripts/demo.sh and scripts/test.sh; safe to run by hand.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
log() { echo "[setup] $*"; }

# --- 1. Debian packages ---------------------------------------------------------------
apt_packages=(build-essential cmake ninja-build pkg-config python3-venv
              liburing-dev nlohmann-json3-dev libgtest-dev libomp-dev fio)
source scripts/apt.sh
LOG_PREFIX=setup apt_ensure "${apt_packages[@]}"

# --- 2. Python environment ---------------------------------------------------------------
py=${ZS_PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  log "creating .venv with $($py --version 2>&1)"
  "$py" -m venv .venv
fi
req_stamp=.venv/.zs-requirements.sha1
req_hash=$(sha1sum requirements.txt | cut -d' ' -f1)
pip_pid=
if [ "$(cat "$req_stamp" 2>/dev/null)" != "$req_hash" ]; then
  # The native build needs only pybind11 and scikit-build-core, not torch: those first, then
  # the rest (torch and its CUDA libraries: a download, not a compile) beside the build.
  log "installing the build's Python packages (pybind11, scikit-build-core)"
  .venv/bin/python -m pip install -q \
    $(grep -E '^(pybind11|scikit-build-core|setuptools|packaging)==' requirements.txt)
  log "installing pinned Python packages (requirements.txt), beside the native build"
  # Not --no-compile: where PYTHONDONTWRITEBYTECODE is set (this sandbox sets it) no .pyc
  # would ever be written, and every process would compile torch from source at import
  # (a clean-clone run's pytest took minutes longer).
  .venv/bin/python -m pip install -q -r requirements.txt > .venv/pip-install.log 2>&1 &
  pip_pid=$!
fi
finish_pip() {
  [ -n "$pip_pid" ] || return 0
  if ! wait "$pip_pid"; then
    cat .venv/pip-install.log >&2
    echo "[setup] pip install -r requirements.txt failed (log above)" >&2
    exit 1
  fi
  pip_pid=
  echo "$req_hash" > "$req_stamp"
}
trap 'if [ -n "$pip_pid" ]; then kill "$pip_pid" 2>/dev/null || true; fi' EXIT

# --- 3. Build and install zerostream -------------------------------------------------------
# One CMake tree (build/native) serves the wheel and the C++ tests, so nothing compiles twice.
src_stamp=.venv/.zs-source.sha1
src_hash=$( (find CMakeLists.txt pyproject.toml cmake common csrc zero offload python tests/cpp -type f \
              ! -name '*.so' ! -path '*/__pycache__/*' -print0 | sort -z | xargs -0 sha1sum) | sha1sum | cut -d' ' -f1)
build_zerostream() {
  log "building zerostream (build/native)"
  CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
  .venv/bin/python -m pip install -q --no-build-isolation --no-deps \
    --config-settings=build-dir=build/native --config-settings=cmake.define.ZS_BUILD_TESTS=ON \
    --config-settings=cmake.define.ZS_STATIC_LIBSTDCXX_VARIANT=ON \
    ${ZS_CMAKE_ARGS:+--config-settings=cmake.args="$ZS_CMAKE_ARGS"} .
  echo "$src_hash" > "$src_stamp"
}
built=0
if [ "$(cat "$src_stamp" 2>/dev/null)" != "$src_hash" ]; then
  build_zerostream
  built=1
fi
finish_pip
# zerostream imports torch, so this check waits for the packages.
if [ "$built" = 0 ] && ! .venv/bin/python -c "import zerostream._C" 2>/dev/null; then
  build_zerostream
fi
# --- 4. The deepspeed compatibility package (docs/compat.md) ----------------------------------
# A top-level `deepspeed` backed by zerostream, so Hugging Face Trainer / Accelerate and scripts
# that `import deepspeed` run unchanged. Never install it beside the real DeepSpeed (.venv-bench).
compat_stamp=.venv/.zs-deepspeed-compat.sha1
compat_hash=$( (find python/deepspeed_compat -type f ! -path '*/__pycache__/*' ! -path '*.egg-info*' -print0 \
                | sort -z | xargs -0 sha1sum; cat python/zerostream/_version.py) | sha1sum | cut -d' ' -f1)
if [ "$(cat "$compat_stamp" 2>/dev/null)" != "$compat_hash" ]; then
  log "installing the deepspeed compatibility package (python/deepspeed_compat)"
  .venv/bin/python -m pip install -q --no-build-isolation --no-index ./python/deepspeed_compat
  echo "$compat_hash" > "$compat_stamp"
fi
log "ready: $(.venv/bin/zerostream --version 2>/dev/null || echo 'zerostream installed')"
