#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh), then runs every test: C++ (ctest) and Python (pytest).
#
#   scripts/test.sh [--slow] [pytest arguments...]
#
# The default tier fits CI's budget (25 minutes on 2 cores). --slow (or ZS_SLOW=1) adds the
# slow tier: the pytest cases marked `slow` (world-4 variants of parity and resharding,
# DeepSpeed's 1-rank checkpoints, the estimator against a real run, benchmark tools' own
# runs) and the aarch64 cross run of the C++ tests under qemu.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
slow=${ZS_SLOW:-0}
if [ "${1:-}" = --slow ]; then slow=1; shift; fi
# Everything the tests need is set up here, so a test whose prerequisite is missing fails
# instead of skipping (tests/python/prerequisites.py), as in CI.
export CI=${CI:-true}

# phase NAME: starts timing NAME (the previous one ends); the table is printed at the end.
phase_names=() phase_secs=() phase_start=$SECONDS
phase() {
  local now=$SECONDS
  if [ ${#phase_names[@]} -gt 0 ]; then phase_secs+=($((now - phase_start))); fi
  phase_names+=("$1") phase_start=$now
  echo "== $1"
}
phase_table() {
  phase_secs+=($((SECONDS - phase_start)))
  echo "== Time by phase (total ${SECONDS} s)"
  local i
  for i in "${!phase_names[@]}"; do printf '%6d s  %s\n' "${phase_secs[$i]}" "${phase_names[$i]}"; done
}
trap phase_table EXIT

phase "Setup (scripts/setup.sh, scripts/deepspeed-peer.sh, .venv-dsunit)"
scripts/setup.sh
# DeepSpeed itself, beside .venv, for the tests that compare with it (never inside .venv).
scripts/deepspeed-peer.sh
# DeepSpeed's test pins (pytest < 8.4), beside .venv: the test that imports every in-scope
# DeepSpeed unit file (tests/python/compat/test_deepspeed_unit_collect.py) runs in it.
scripts/deepspeed-unit.sh --setup

# Formatting and lint first, for quick feedback; a failure still lets the tests run and
# fails the whole run at the end.
phase "Lint (scripts/lint.sh: clang-format, ruff)"
lint_failed=0
scripts/lint.sh || lint_failed=1

phase "C++ tests (ctest)"
ctest --test-dir build/native --output-on-failure -j "$(nproc)" --timeout 600

# build_variant DIR [cmake build args...] -- CMAKE_DEFINES...: a C++-tests-only build without
# CUDA in build/DIR, its log in build/DIR-build.log, whose tail is shown when it fails.
build_variant() {
  local dir=build/$1 targets=()
  shift
  while [ "$1" != -- ]; do targets+=("$1"); shift; done
  shift
  mkdir -p build
  # -O0 -g1 (line tables, for the reports' stacks): the sanitizers check the same accesses at
  # any level; on a clean clone here the AddressSanitizer variant compiled in 377 s at -O1
  # (-O2 took longer still) and in 187 s at -O0, and its tests ran in 26 s either way.
  # A unity build (16 sources a unit; CMake leaves out files with their own flags, the SIMD
  # levels) parses the shared headers (gtest, nlohmann/json) once a unit: 58 s against 118 s
  # for the AddressSanitizer variant on this 2-core machine, the same 182 tests.
  if ! { cmake -S . -B "$dir" -G Ninja -DZS_WITH_CUDA=OFF -DZS_BUILD_PYTHON=OFF \
           -DZS_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
           -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=16 \
           "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O0 -g1" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O0 -g1" \
           "$@" &&
         cmake --build "$dir" -j "$(nproc)" "${targets[@]}"; } > "$dir-build.log" 2>&1; then
    tail -n 60 "$dir-build.log"
    echo "$dir build failed (full log: $dir-build.log)" >&2
    exit 1
  fi
}

# A second C++ build serves two checks at once: it is built without CUDA (ZS_WITH_CUDA=OFF,
# what a machine without nvcc builds; the main build has CUDA when nvcc is here) and with
# AddressSanitizer + LeakSanitizer, so every native test also runs checked for memory errors
# and leaks.
phase "C++ tests, ZS_WITH_CUDA=OFF + AddressSanitizer variant (build/asan)"
build_variant asan -- -DZS_SANITIZE=ON
ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build/asan --output-on-failure -j "$(nproc)" \
  --timeout 600

# ThreadSanitizer over the offload engine: its worker threads, tickets and fixed-resource
# tables are where data races would be. Only that suite is built and run: libgomp is not
# instrumented, so the OpenMP optimizer code would give false reports.
phase "C++ offload tests, ThreadSanitizer variant (build/tsan)"
build_variant tsan --target zs_test_offload -- -DZS_TSAN=ON
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" ctest --test-dir build/tsan \
  --output-on-failure -j "$(nproc)" --timeout 600 -R '^offload\.'

# On an aarch64 host the tests above already ran natively; ZS_SKIP_AARCH64=1 skips the
# cross run (it needs apt access for the cross toolchain).
if [ "$slow" != 1 ]; then
  echo "== C++ tests cross-built for aarch64: slow tier (scripts/test.sh --slow)"
elif [ "$(uname -m)" != aarch64 ] && [ "${ZS_SKIP_AARCH64:-0}" != 1 ]; then
  phase "C++ tests cross-built for aarch64, under qemu-user (build/aarch64)"
  scripts/test-aarch64.sh
fi

# The config error tests once more with a _C linked by -static-libstdc++ and loaded after
# torch: a toolchain that links libstdc++ statically once made that crash (GPU data-path
# issue; tests/python/conftest.py loads it, test_module_exports.py checks it is that build).
variant=(build/native/static-libstdcxx/zerostream/_C*.so)
if [ ${#variant[@]} -ne 1 ] || [ ! -f "${variant[0]}" ]; then
  echo "expected one -static-libstdc++ _C under build/native/static-libstdcxx; got: ${variant[*]}" >&2
  exit 1
fi
# The load and hostile-input tests format every kind of error message (the crash was in
# std::ostream while formatting one); the fuzz and corpus tests add time, not paths.
phase "Config error tests with ${variant[0]} (-static-libstdc++) loaded after torch"
ZS_LOAD_C_FROM="${variant[0]}" .venv/bin/python -m pytest -q -p no:cacheprovider \
  tests/python/config/test_load.py tests/python/config/test_hostile.py \
  tests/python/test_module_exports.py

if [ "$slow" = 1 ]; then
  phase "Python tests (pytest), but those of the device under test"
  .venv/bin/python -m pytest -q -ra --durations=15 -m "not device" "$@"
else
  phase "Python tests (pytest), but those of the device under test and the slow tier"
  .venv/bin/python -m pytest -q -ra --durations=15 -m "not device and not slow" "$@"
fi

# The device tests (engine parity on the device for stages 1-3 x offload none/cpu/nvme)
# run through the one command that checks a GPU box, here on the simulated device, so that
# command is exercised on every CI run (README: GPU path).
phase "scripts/gpu-check.sh --simulated"
scripts/gpu-check.sh --simulated

if [ "$lint_failed" -ne 0 ]; then
  echo "All tests passed, but lint failed (see '== Lint' above)" >&2
  exit 1
fi
