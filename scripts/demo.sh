#!/usr/bin/env bash
# The main job, from a fresh clone: set up, then train a tiny GPT on 2 ranks with ZeRO stage 3,
# its parameters and optimizer states on NVMe (files under a temporary directory), save a
# checkpoint, resume it in new processes, and print where the loss/traffic plot is.
# Environment: ZS_DEMO_OUT (default build/demo) keeps the plots, summaries and checkpoint;
# ZS_DEMO_STEPS (default 150) sets the first run's length.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
scripts/setup.sh
zs=.venv/bin/zerostream
py=.venv/bin/python

out=${ZS_DEMO_OUT:-build/demo}
steps=${ZS_DEMO_STEPS:-150}
rm -rf "$out" && mkdir -p "$out"
nvme=$(mktemp -d "${TMPDIR:-/tmp}/zerostream-demo-nvme.XXXXXX")
trap 'rm -rf "$nvme"' EXIT

echo "== zerostream report"
"$zs" report --path "$nvme"

config=configs/zero3_offload_nvme.json
echo "== zerostream config check $config"
"$zs" config check "$config" --world-size 2

train=(examples/train_gpt.py --deepspeed_config "$config" --nvme-path "$nvme" --size tiny
       --lr 3e-3 --eval-every 25 --save-dir "$out/checkpoints")

echo "== train: $steps steps on 2 ranks (stage 3, params + optimizer on NVMe under $nvme)"
"$zs" run --nproc 2 "${train[@]}" --steps "$steps" --out "$out/run1"

echo "== resume from $out/checkpoints in new processes: 30 more steps"
"$zs" run --nproc 2 "${train[@]}" --steps 30 --resume "$out/checkpoints" --out "$out/run2"

# The demo's own verdict, from the two runs' summaries.
"$py" - "$out" <<'EOF'
import json, sys
out = sys.argv[1]
run1 = json.load(open(f"{out}/run1/summary.json"))
run2 = json.load(open(f"{out}/run2/summary.json"))
v0, v1 = run1["validation_loss"]
r0, r1 = run2["validation_loss"]
swap = run1["swap_files"]
problems = []
if not v1 < 0.75 * v0:
    problems.append(f"validation loss {v0:.3f} -> {v1:.3f} did not fall below 75% of the start")
if not swap["state_bytes"] > 0:
    problems.append("the swap files held no state: nothing was offloaded to disk")
if abs(r0 - v1) > 1e-6 * max(1.0, abs(v1)):
    problems.append(f"the resumed run started at {r0:.3f}, not where the saved run ended ({v1:.3f})")
if r1 > r0 + 0.05:
    problems.append(f"the resumed run's validation loss rose, {r0:.3f} -> {r1:.3f}")
disk = sum(v["allocated_bytes"] for v in swap["paths"].values())
print(f"validation loss {v0:.3f} -> {v1:.3f}; resumed at {r0:.3f} (saved run ended at {v1:.3f})"
      f" -> {r1:.3f}; rank 0 kept {swap['state_bytes'] / 2**20:.2f} MiB of state in"
      f" {disk / 2**20:.1f} MiB of swap files on disk")
print(f"plots: {out}/run1/train_gpt.png {out}/run2/train_gpt.png")
if problems:
    sys.exit("demo: " + "; ".join(problems))
EOF
