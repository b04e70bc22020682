#!/usr/bin/env bash
# Sets up the benchmark peers and runs every benchmark (DESIGN.md §7): fio (Debian) for the
# disk, DeepSpeed from PyPI (its cpu_adam and async_io ops JIT-built here) for the optimizer
# and the aio handle, torch's optimizers. Peers live in .venv-bench so the test environment
# never sees them. Results: printed tables plus JSON under build/bench/.
#   ZS_BENCH_PATH   directory on the drive to measure (default build/bench/io)
#   ZS_BENCH_SIZE   bytes per I/O pass (default 1G)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
scripts/setup.sh
log() { echo "[bench] $*"; }

source scripts/apt.sh
LOG_PREFIX=bench apt_ensure fio libaio-dev

venv=.venv-bench
stamp=$venv/.zs-bench.sha1
want=$(cat requirements.txt requirements-bench.txt | sha1sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  log "creating $venv with DeepSpeed as a peer"
  "${ZS_PYTHON:-python3}" -m venv "$venv"
  "$venv/bin/python" -m pip install -q -r requirements.txt -r requirements-bench.txt
  DS_BUILD_OPS=0 "$venv/bin/python" -m pip install -q --no-build-isolation deepspeed==0.19.8
  echo "$want" > "$stamp"
fi
log "installing zerostream into $venv"
"$venv/bin/python" -m pip install -q --no-build-isolation --no-deps \
  --config-settings=build-dir=build/bench-native .

out=build/bench
path=${ZS_BENCH_PATH:-$out/io}
mkdir -p "$out" "$path"
log "bench io on $path"
"$venv/bin/zerostream" bench io --path "$path" --size "${ZS_BENCH_SIZE:-1G}" --block-size 1M \
  --queue-depth 32 --loops 5
"$venv/bin/zerostream" bench io --path "$path" --size "${ZS_BENCH_SIZE:-1G}" --block-size 1M \
  --queue-depth 32 --loops 5 --json > "$out/io.json"
log "bench optim"
PY="$venv/bin/python" benchmarks/optim.sh --threads "$(nproc)"
log "bench optim --model gpt2-small"
"$venv/bin/zerostream" bench optim --model gpt2-small --threads "$(nproc)" --repeats 7 \
  --json-out "$out/optim-gpt2-small.json"
for offload in cpu nvme; do
  log "bench step: GPT small, stage 2, optimizer offload $offload (peers: no offload, torch, DeepSpeed)"
  "$venv/bin/zerostream" bench step --size small --stage 2 --offload-optimizer "$offload" \
    --nvme-path "$path" --steps 10 --warmup 3 --json > "$out/step-$offload.json"
  "$venv/bin/python" -c "import json, sys; from zerostream.bench.step import _print_table; \
_print_table(json.load(open(sys.argv[1])))" "$out/step-$offload.json"
done
log "results in $out/"
