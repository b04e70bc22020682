#!/usr/bin/env bash
# The CPU optimizer benchmark of the issue: zerostream's fused AdamW (bf16 grads, bf16 param
# copy) against the machine's memory roofline, torch's fused/foreach AdamW and DeepSpeed's
# CPU Adam when importable, in one run. Prints the table and saves the JSON.
# Usage: benchmarks/optim.sh [extra `bench optim` arguments]   (env PY: the interpreter)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=${PY:-$root/.venv/bin/python}
out=${ZS_BENCH_OUT:-$root/build/bench}
mkdir -p "$out"
args=(--numel 2e8 --optimizer adamw --grad-dtype bf16 --param-copy bf16 "$@")
"$py" -m zerostream.bench.optim "${args[@]}" \
  --json-out "$out/optim.json"
echo "saved $out/optim.json"
