#!/usr/bin/env bash
# The main job. For now: set up, print the environment report, and validate every config in
# configs/ (the real training job replaces this with the engine issue).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
scripts/setup.sh
zs=.venv/bin/zerostream

echo "== zerostream report"
mkdir -p build/demo-nvme
"$zs" report --path build/demo-nvme

echo "== zerostream config check (every file in configs/)"
for f in configs/*.json; do
  "$zs" config check "$f" --world-size 2
done
