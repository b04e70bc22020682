#!/usr/bin/env bash
# Cross-builds the portable native subsystems (common, config, optim, zero) for aarch64 and
# runs their C++ tests under qemu-user: the optimizer kernels' scalar/NEON path, the config
# parser (char is unsigned there) and the partition arithmetic must give the same results
# on aarch64 as on x86-64. Installs what it needs (Debian's cross g++, qemu-user, arm64
# multiarch liburing-dev and libgtest-dev). Called by scripts/test.sh; safe to run by hand.
#
# OMP_THREAD_LIMIT=1: on this project's machines (Firecracker guests) qemu-user hangs in
# the guest's first pthread_create (seen with qemu 7.2 and 10.0), so the emulated tests run
# every OpenMP region on one thread. Thread-count independence is tested natively.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
log() { echo "[aarch64] $*"; }

source scripts/apt.sh
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  log "adding the arm64 architecture to dpkg"
  apt_sudo dpkg --add-architecture arm64
fi
# Host tools and headers too (cmake, ninja, nlohmann-json; libgtest-dev is Multi-Arch: same,
# so the host and arm64 packages come in matching versions), so it also runs on its own.
LOG_PREFIX=aarch64 apt_ensure cmake ninja-build pkg-config nlohmann-json3-dev libgtest-dev \
  g++-aarch64-linux-gnu qemu-user liburing-dev:arm64 libgtest-dev:arm64

mkdir -p build
log "cross-building (build/aarch64)"
if ! { cmake -S . -B build/aarch64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
         -DZS_BUILD_PYTHON=OFF -DZS_WITH_CUDA=OFF -DZS_BUILD_TESTS=ON &&
       cmake --build build/aarch64 -j "$(nproc)" --target zs_test_common zs_test_config \
         zs_test_optim zs_test_zero; } > build/aarch64-build.log 2>&1; then
  tail -n 60 build/aarch64-build.log
  echo "aarch64 cross build failed (full log: build/aarch64-build.log)" >&2
  exit 1
fi
log "running the tests under $(qemu-aarch64 --version | head -n1)"
OMP_THREAD_LIMIT=1 ctest --test-dir build/aarch64 --output-on-failure -j "$(nproc)" \
  --timeout 600 -R '^(common|config|optim|zero)\.'
