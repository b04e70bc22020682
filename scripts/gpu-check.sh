#!/usr/bin/env bash
# The GPU check in one command: build, the device tests (engine parity on the device for
# ZeRO stages 1-3 x offload none/cpu/nvme), the same tests under torch's CUDA stream
# sanitizer, and `bench step` against DeepSpeed and plain torch at the GPT-2 XL shape
# (stage 2 + offload_optimizer cpu; stage 3 cpu/cpu; stage 3 nvme/nvme). Writes one JSON and
# one Markdown summary (build/gpu-check/summary.{json,md}, or --out DIR) and exits 0 only
# when every step passed.
#
#   scripts/gpu-check.sh               on a machine with an NVIDIA GPU (about 8 minutes on
#                                      one H100): uses the offline kit of ../shared/gpu (copy
#                                      it to shared/gpu in the checkout, or set ZS_GPU_KIT)
#   scripts/gpu-check.sh --simulated   the same list on the simulated device, on a machine
#                                      without a GPU (CI runs this): the device tests run on
#                                      zerostream.testing.sim_device, bench step on the CPU at
#                                      a tiny shape; the stream sanitizer needs CUDA and is
#                                      reported as not applicable
#
# Options: --out DIR, --no-bench, --bench-steps N. Each step's log is in the output folder.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

simulated=0
out=build/gpu-check
bench=1
bench_steps=3
while [ $# -gt 0 ]; do
  case "$1" in
    --simulated) simulated=1 ;;
    --out) out=$2; shift ;;
    --no-bench) bench=0 ;;
    --bench-steps) bench_steps=$2; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "gpu-check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
steps_file=$out/steps.tsv
: > "$steps_file"
log() { echo "[gpu-check] $*"; }

# step NAME COMMAND...: runs it with its output in $out/NAME.log; records status and time.
step() {
  local name=$1 start rc
  shift
  log "$name: $*"
  start=$(date +%s)
  "$@" > "$out/$name.log" 2>&1
  rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - start ))" >> "$steps_file"
  if [ "$rc" -ne 0 ]; then
    log "$name FAILED (exit $rc); last lines of $out/$name.log:"
    tail -n 25 "$out/$name.log"
  fi
  return "$rc"
}
skipped() { printf '%s\tskipped\t0\t%s\n' "$1" "$2" >> "$steps_file"; log "$1: skipped ($2)"; }

if [ "$simulated" -eq 1 ]; then
  scripts/setup.sh > "$out/setup.log" 2>&1 || { tail -n 30 "$out/setup.log"; exit 1; }
  PY=$root/.venv/bin/python
  export ZS_TEST_DEVICE=sim
  device="simulated device (zerostream.testing.sim_device) on $(nproc) CPU cores"
  bench_size=(--size tiny)
  bench_precision=fp32
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
  # The box's default compiler wraps a relocated GCC that links libstdc++ statically (see the
  # kit's README): build with the system's, which torch's libstdc++ matches.
  if [ -x /usr/bin/g++ ]; then export CXX=/usr/bin/g++ CC=/usr/bin/gcc CUDAHOSTCXX=/usr/bin/g++; fi
  PY=$(command -v python3)
  device=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -n1)
  nvidia-smi > "$out/nvidia-smi.log" 2>&1
  site=/tmp/zs-site
  build_zs() {
    CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$PY" -m pip install -q --no-build-isolation --no-deps \
      --no-index --target "$site" --upgrade --config-settings=build-dir=build/gpu \
      --config-settings=cmake.define.ZS_BUILD_TESTS=ON . &&
      ctest --test-dir build/gpu -j "$(nproc)" --output-on-failure --timeout 300
  }
  step build build_zs || { log "the build failed: nothing else can run"; }
  export PYTHONPATH=$site:${PYTHONPATH:-}
  # DeepSpeed as the benchmark peer (its ops JIT-built on first use).
  DS_BUILD_OPS=0 "$PY" -m pip install -q --no-build-isolation --no-deps --no-index \
    --target /tmp/site "$kit"/wheels/deepspeed-*.tar.gz > "$out/deepspeed-install.log" 2>&1 ||
    log "DeepSpeed did not install (see deepspeed-install.log): its bench column will say so"
  bench_size=(--size xl)
  bench_precision=bf16
fi
log "device: $device"

# The tests that run on the device under test (pytest marker "device").
tests=(-m device -p no:cacheprovider -q -ra tests/python)
step device-tests "$PY" -m pytest "${tests[@]}"
if [ "$simulated" -eq 1 ]; then
  skipped sanitizer "TORCH_CUDA_SANITIZER needs CUDA; the simulated device's own checks ran in device-tests"
else
  step sanitizer env TORCH_CUDA_SANITIZER=1 "$PY" -m pytest "${tests[@]}"
fi

# bench step: name, measured steps (--bench-steps caps them), then the configuration's flags.
# At the GPT-2 XL shape a step of the NVMe configuration moves ~36 GB to and from a disk of
# about 1.1 GB/s (the kit's box): one measured step each there.
configs=(
  "stage2-cpu 3 --stage 2 --offload-optimizer cpu --peers zerostream,no-offload,deepspeed,torch"
  "stage3-cpu-cpu 3 --stage 3 --offload-optimizer cpu --offload-param cpu --peers zerostream,deepspeed,torch"
  "stage3-nvme-nvme 1 --stage 3 --offload-optimizer nvme --offload-param nvme --peers zerostream,deepspeed"
)
# bench_one NAME STEPS FLAGS...: its JSON in $out/bench-NAME.json, its log in $out/bench-NAME.log.
bench_one() {
  local name=$1 steps=$(( $2 < bench_steps ? $2 : bench_steps ))
  shift 2
  "$PY" -m zerostream.bench.step "${bench_size[@]}" --precision "$bench_precision" \
    --steps "$steps" --warmup 1 --micro-batch 4 --timeout 300 --json \
    --nvme-path "$out/nvme" "$@" > "$out/bench-$name.json"
}
if [ "$bench" -eq 1 ]; then
  mkdir -p "$out/nvme"
  for c in "${configs[@]}"; do
    read -r name steps flags <<< "$c"
    # shellcheck disable=SC2086
    step "bench-$name" bench_one "$name" "$steps" $flags
  done
else
  skipped bench "--no-bench"
fi

"${PY}" - "$out" "$device" "$simulated" <<'PY'
import json, pathlib, sys

out, device, simulated = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
steps = []
for line in (out / "steps.tsv").read_text().splitlines():
    name, status, seconds, *why = line.split("\t")
    steps.append({"step": name, "status": status, "seconds": int(seconds), "why": why[0] if why else ""})
bench = {}
for s in steps:
    if s["step"].startswith("bench-") and s["status"] == "0":
        bench[s["step"][6:]] = json.loads((out / f"{s['step']}.json").read_text())
summary = {"device": device, "simulated": simulated, "steps": steps, "bench": bench}
(out / "summary.json").write_text(json.dumps(summary, indent=2))
md = [f"# gpu-check on {device}", "", "| step | result | seconds |", "|---|---|---|"]
for s in steps:
    result = {"0": "passed", "skipped": f"skipped: {s['why']}"}.get(s["status"], f"FAILED (exit {s['status']})")
    md.append(f"| {s['step']} | {result} | {s['seconds']} |")
for name, res in bench.items():
    md += ["", f"## bench step {name}", "", "| peer | s/step | tokens/s | peak device GiB | peak RSS GiB |", "|---|---|---|---|---|"]
    for peer, r in res["peers"].items():
        if "median_step_seconds" not in r:
            md.append(f"| {peer} | {r.get('skipped') or r.get('error', '?').splitlines()[0]} | | | |")
            continue
        dev = r.get("peak_device_bytes")
        md.append(
            f"| {peer} | {r['median_step_seconds']:.3f} | {r['tokens_per_second']:.0f} | "
            f"{'-' if dev is None else f'{dev / 2**30:.1f}'} | {r['peak_rss_bytes'] / 2**30:.1f} |"
        )
    for key, value in res.get("ratios", {}).items():
        md.append(f"\n{key}: {value:.3f}")
(out / "summary.md").write_text("\n".join(md) + "\n")
print("\n".join(md))
PY

failed=$(awk -F'\t' '$2 != "0" && $2 != "skipped" {print $1}' "$steps_file")
if [ -n "$failed" ]; then
  log "failed: $(echo $failed)"
  exit 1
fi
log "all passed; summary in $out/summary.md"
