#!/usr/bin/env bash
# The GPU check in one command: build, the device tests (engine parity on the device for
# ZeRO stages 1-3 x offload none/cpu/nvme), a subset of them under torch's CUDA stream
# sanitizer, and `bench step` against DeepSpeed and plain torch at the GPT-2 XL shape
# (stage 2 + offload_optimizer cpu; stage 3 cpu/cpu; stage 3 nvme/nvme). Writes one JSON and
# one Markdown summary (summary.{json,md} in build/gpu-check, or --out DIR), rewritten after
# every step so a run cut short still reports what it did, and exits 0 only when every step
# that ran passed.
#
#   scripts/gpu-check.sh               on a machine with an NVIDIA GPU: uses the offline kit of
#                                      ../shared/gpu (copy it to shared/gpu in the checkout,
#                                      or set ZS_GPU_KIT); steps run in order of importance
#                                      within --budget seconds (default 540: one H100 call),
#                                      each with a time limit, and the ones that no longer fit
#                                      are reported as skipped
#   scripts/gpu-check.sh --simulated   the same list on the simulated device, on a machine
#                                      without a GPU (CI runs this): the device tests run on
#                                      zerostream.testing.sim_device, bench step on the CPU at
#                                      a tiny shape; the stream sanitizer needs CUDA and is
#                                      reported as not applicable
#
# Options: --out DIR, --budget SECONDS, --no-bench, --bench-steps N (default 2).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

simulated=0
out=build/gpu-check
bench=1
bench_steps=2
budget=
while [ $# -gt 0 ]; do
  case "$1" in
    --simulated) simulated=1 ;;
    --out) out=$2; shift ;;
    --budget) budget=$2; shift ;;
    --no-bench) bench=0 ;;
    --bench-steps) bench_steps=$2; shift ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "gpu-check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
steps_file=$out/steps.tsv
: > "$steps_file"
started=$(date +%s)
if [ -z "$budget" ]; then budget=$([ "$simulated" -eq 1 ] && echo 3600 || echo 540); fi
# Steps' time limits are set for an H100 box; a 2-core machine simulating it takes longer.
scale=$([ "$simulated" -eq 1 ] && echo 4 || echo 1)
log() { echo "[gpu-check] $*"; }
left() { echo $(( started + budget - $(date +%s) )); }

summarize() {
  "$PY" - "$out" "$device" "$simulated" <<'PY'
import json, pathlib, sys

out, device, simulated = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
steps = []
for line in (out / "steps.tsv").read_text().splitlines():
    name, status, seconds, *why = line.split("\t")
    steps.append({"step": name, "status": status, "seconds": int(seconds), "why": why[0] if why else ""})
bench = {}
for s in steps:
    path = out / f"{s['step']}.json"
    if s["step"].startswith("bench-") and s["status"] == "0" and path.is_file():
        bench[s["step"][6:]] = json.loads(path.read_text())
summary = {"device": device, "simulated": simulated, "steps": steps, "bench": bench}
(out / "summary.json").write_text(json.dumps(summary, indent=2))
md = [f"# gpu-check on {device}", "", "| step | result | seconds |", "|---|---|---|"]
for s in steps:
    result = {"0": "passed", "skipped": f"skipped: {s['why']}"}.get(
        s["status"], f"FAILED (exit {s['status']}{', time limit' if s['status'] == '124' else ''})"
    )
    md.append(f"| {s['step']} | {result} | {s['seconds']} |")
for name, res in bench.items():
    md += ["", f"## bench step {name}", ""]
    md += ["| peer | s/step | tokens/s | peak device GiB | peak RSS GiB |", "|---|---|---|---|---|"]
    for peer, r in res["peers"].items():
        if "median_step_seconds" not in r:
            why = r.get("skipped") or r.get("error", "?")
            md.append(f"| {peer} | {why.splitlines()[0]} | | | |")
            continue
        dev = r.get("peak_device_bytes")
        md.append(
            f"| {peer} | {r['median_step_seconds']:.3f} | {r['tokens_per_second']:.0f} | "
            f"{'-' if dev is None else f'{dev / 2**30:.1f}'} | {r['peak_rss_bytes'] / 2**30:.1f} |"
        )
    md += [""] + [f"- {key}: {value:.3f}" for key, value in res.get("ratios", {}).items()]
(out / "summary.md").write_text("\n".join(md) + "\n")
PY
}

# step NAME CAP_SECONDS STDOUT COMMAND...: runs COMMAND within min(CAP, the budget left),
# stdout to STDOUT ("-": the step's log), stderr to $out/NAME.log; records status and time,
# then rewrites the summary.
step() {
  local name=$1 cap=$(( $2 * scale )) stdout=$3 start rc limit
  shift 3
  limit=$(( $(left) - 5 ))
  [ "$cap" -lt "$limit" ] && limit=$cap
  if [ "$limit" -lt 30 ]; then
    skipped "$name" "no time left in the ${budget} s budget"
    return 0
  fi
  [ "$stdout" = - ] && stdout=$out/$name.log
  log "$name (at most ${limit} s): $*"
  start=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" > "$stdout" 2>> "$out/$name.log"
  rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - start ))" >> "$steps_file"
  if [ "$rc" -ne 0 ]; then
    log "$name FAILED (exit $rc$([ "$rc" -eq 124 ] && echo ', time limit')); last lines of $out/$name.log:"
    tail -n 25 "$out/$name.log"
  fi
  summarize
  return "$rc"
}
skipped() {
  printf '%s\tskipped\t0\t%s\n' "$1" "$2" >> "$steps_file"
  log "$1: skipped ($2)"
  summarize
}

if [ "$simulated" -eq 1 ]; then
  scripts/setup.sh > "$out/setup.log" 2>&1 || { tail -n 30 "$out/setup.log"; exit 1; }
  PY=$root/.venv/bin/python
  export ZS_TEST_DEVICE=sim
  device="simulated device (zerostream.testing.sim_device) on $(nproc) CPU cores"
  bench_size=(--size tiny)
  bench_precision=fp32
  nvme=$out/nvme
else
  if ! command -v nvidia-smi > /dev/null || ! nvidia-smi > /dev/null 2>&1; then
    echo "gpu-check: no NVIDIA GPU here (nvidia-smi); use --simulated on a machine without one" >&2
    exit 2
  fi
  kit=${ZS_GPU_KIT:-}
  for k in shared/gpu ../shared/gpu; do [ -z "$kit" ] && [ -f "$k/env.sh" ] && kit=$k; done
  if [ -z "$kit" ]; then
    echo "gpu-check: the offline kit (env.sh, debs/, wheels/) is not in shared/gpu, ../shared/gpu or \$ZS_GPU_KIT" >&2
    exit 2
  fi
  # shellcheck disable=SC1091
  . "$kit/env.sh"
  # DeepSpeed's JIT builder parses the architecture list as numbers: a preset "9.0a" (the
  # H100 box has one) stops its ops from building. Name the card's own.
  TORCH_CUDA_ARCH_LIST=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n1)
  export TORCH_CUDA_ARCH_LIST
  PY=$(command -v python3)
  if ! "$PY" -c "import pytest, pytest_timeout" 2> /dev/null; then
    echo "gpu-check: $PY has no pytest/pytest-timeout; install them (or carry their wheels)" >&2
    exit 2
  fi
  # The box's default compiler wraps a relocated GCC that links libstdc++ statically (see the
  # kit's README): build with the system's, which torch's libstdc++ matches.
  if [ -x /usr/bin/g++ ]; then export CXX=/usr/bin/g++ CC=/usr/bin/gcc CUDAHOSTCXX=/usr/bin/g++; fi
  device=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -n1)
  nvidia-smi > "$out/nvidia-smi.log" 2>&1
  site=/tmp/zs-site
  if ! step build 300 - bash -c "CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) '$PY' -m pip install -q \
      --no-build-isolation --no-deps --no-index --target '$site' --upgrade \
      --config-settings=build-dir=build/gpu --config-settings=cmake.define.ZS_BUILD_TESTS=ON . &&
      ctest --test-dir build/gpu -j $(nproc) --output-on-failure --timeout 120"; then
    log "the build failed: nothing else can run"
    exit 1
  fi
  export PYTHONPATH=$site:${PYTHONPATH:-}
  # DeepSpeed as the benchmark peer (its ops JIT-built on first use).
  DS_BUILD_OPS=0 "$PY" -m pip install -q --no-build-isolation --no-deps --no-index \
    --target /tmp/site "$kit"/wheels/deepspeed-*.tar.gz > "$out/deepspeed-install.log" 2>&1 ||
    log "DeepSpeed did not install (see deepspeed-install.log): its bench column will say so"
  # Its CPU Adam and async I/O ops are JIT-built on first use (a minute or more): build them
  # now, beside the device tests, so the first bench peer's time limit is not spent compiling.
  "$PY" -c "from deepspeed.ops.op_builder import CPUAdamBuilder, AsyncIOBuilder
CPUAdamBuilder().load(); AsyncIOBuilder().load()" > "$out/deepspeed-jit.log" 2>&1 &
  ds_jit=$!
  bench_size=(--size xl)
  bench_precision=bf16
  nvme=/tmp/zs-gpu-check-nvme  # tens of GB at this shape: never in the output folder
fi
log "device: $device; budget $budget s"

# The tests that run on the device under test (pytest marker "device").
tests=(-m device -p no:cacheprovider -q -ra tests/python/zero/test_device_engine.py
  tests/python/engine/test_checkpoint_in_cpu.py tests/python/offload/test_device_auto.py
  tests/python/zero/test_device_syncs.py tests/python/profiling/test_profiling_on_gpu.py)
step device-tests 240 - "$PY" -m pytest "${tests[@]}"
# The sanitizer checks every kernel's stream accesses in Python: slow, so a few cases; it
# comes before the benches because correctness outranks speed.
if [ "$simulated" -eq 1 ]; then
  skipped sanitizer "TORCH_CUDA_SANITIZER needs CUDA; the simulated device's own checks ran in device-tests"
else
  step sanitizer 180 - env TORCH_CUDA_SANITIZER=1 ZS_DEVICE_CASES=quick "$PY" -m pytest "${tests[@]}"
fi

# bench step: name, measured steps (--bench-steps caps them), time limit, the flags. At the
# GPT-2 XL shape a step of the NVMe configuration moves ~36 GB to and from a disk of about
# 1.1 GB/s (the kit's box): one measured step there.
configs=(
  "stage2-cpu 3 200 --stage 2 --offload-optimizer cpu --peers zerostream,no-offload,deepspeed,torch"
  "stage3-cpu-cpu 3 160 --stage 3 --offload-optimizer cpu --offload-param cpu --peers zerostream,deepspeed,torch"
  "stage3-nvme-nvme 1 240 --stage 3 --offload-optimizer nvme --offload-param nvme --peers zerostream,deepspeed"
  "stage3-cpu-overlap 3 160 --stage 3 --offload-optimizer cpu --overlap-step --peers zerostream,serial-step,no-offload"
  "stage3-cpu-speculate 3 120 --stage 3 --offload-optimizer cpu --overlap-step backward --peers zerostream,serial-step"
  "stage2-cpu-speculate 3 120 --stage 2 --offload-optimizer cpu --overlap-step backward --peers zerostream,serial-step"
  "stage2-cpu-device-share 3 160 --stage 2 --offload-optimizer cpu --optimizer-max-on-device auto --peers zerostream,no-offload"
  "stage3-nvme-overlap 1 240 --stage 3 --offload-optimizer nvme --offload-param nvme --overlap-step --peers zerostream,serial-step"
)
run_bench() {
  local name steps cap flags peers
  read -r name steps cap flags <<< "$1"
  [ "$steps" -gt "$bench_steps" ] && steps=$bench_steps
  peers=$(echo "$flags" | sed 's/.*--peers //' | tr ',' '\n' | wc -l)
  # A peer may take up to twice its even share: zerostream runs first, the slowest peer
  # should not starve the rest, and the step's own limit still bounds them all.
  mkdir -p "$nvme"
  # On the simulated device the peers' numbers mean nothing (a CPU playing a GPU): each
  # configuration runs once, zerostream alone, to check the command and its flags (CI).
  [ "$simulated" -eq 1 ] && flags="$flags --peers zerostream"
  # shellcheck disable=SC2086
  step "bench-$name" "$cap" "$out/bench-$name.json" "$PY" -m zerostream.bench.step \
    "${bench_size[@]}" --precision "$bench_precision" --steps "$steps" --warmup 1 \
    --micro-batch 4 --timeout $(( cap * scale * 2 / (peers + 1) )) --json --nvme-path "$nvme" $flags
  rm -rf "$nvme"
}
if [ -n "${ds_jit:-}" ]; then
  wait "$ds_jit" || log "DeepSpeed's ops did not build (see deepspeed-jit.log): its bench column will say why"
fi
if [ "$bench" -eq 1 ] && [ "$simulated" -eq 1 ]; then
  # CI's 25 minutes: on the simulated device one configuration, the one with the most
  # offload flags, checks the command; bench step's own tests run the others on the CPU.
  skipped bench-stage2-cpu "simulated: bench-stage3-nvme-nvme checks the command"
  skipped bench-stage3-cpu-cpu "simulated: bench-stage3-nvme-nvme checks the command"
  skipped bench-stage3-cpu-overlap "simulated: bench-stage3-nvme-nvme checks the command"
  skipped bench-stage2-cpu-device-share "simulated: bench-stage3-nvme-nvme checks the command"
  skipped bench-stage3-cpu-speculate "simulated: bench-stage3-nvme-nvme checks the command"
  skipped bench-stage2-cpu-speculate "simulated: bench-stage3-nvme-nvme checks the command"
  skipped bench-stage3-nvme-overlap "simulated: bench-stage3-nvme-nvme checks the command"
elif [ "$bench" -eq 1 ]; then
  # By index into configs: the older targets first, the step started during the backward
  # (4, 5) last, so a short budget still measures the rest.
  for i in 0 1 3 6 4 5; do
    run_bench "${configs[$i]}"
  done
fi
if [ "$bench" -eq 1 ]; then
  run_bench "${configs[2]}"
  [ "$simulated" -eq 1 ] || run_bench "${configs[7]}"  # NVMe behind the next forward, last
else
  skipped bench "--no-bench"
fi

cat "$out/summary.md"
failed=$(awk -F'\t' '$2 != "0" && $2 != "skipped" {print $1}' "$steps_file")
if [ -n "$failed" ]; then
  log "failed: $(echo $failed)"
  exit 1
fi
log "done in $(( $(date +%s) - started )) s; summary in $out/summary.md"
