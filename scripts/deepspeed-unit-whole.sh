#!/usr/bin/env bash
# DeepSpeed's whole in-scope unit suite on both packages, file by file, DeepSpeed itself first
# and then zerostream at one commit, so that a run stopped part way holds both packages'
# outcomes for the same files; run again with the same OUT, it takes up where it stopped.
#
#   [ZS_DSUNIT_FIRST="unit/a.py unit/b.py"] scripts/deepspeed-unit-whole.sh CHECKOUT OUT [--timeout S]
#
# ZS_DSUNIT_FIRST: files to run before the others (those a change touched, say).
# zerostream is tested from a copy of HEAD's python/ (with the built _C) made in OUT on the
# first run, so the work tree may change meanwhile; OUT/commit names it. When every file is
# done, OUT/deepspeed.json, OUT/zerostream.json and OUT/compare.json hold the count
# (scripts/deepspeed-unit.sh --compare). Hours on 2 cores: not part of scripts/test.sh.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
checkout=$(cd "$1" && pwd)
out=$(mkdir -p "$2" && cd "$2" && pwd)
shift 2
cd "$root"
# ZS_DSUNIT_REFRESH=1: test the files not yet done at HEAD instead (each file's record names
# the commit it was tested at).
if [ ! -f "$out/commit" ] || [ "${ZS_DSUNIT_REFRESH:-0}" = 1 ]; then
  [ -z "$(git status --porcelain -- python csrc)" ] \
    || { echo "deepspeed-unit-whole: python/ or csrc/ has uncommitted changes; commit first" >&2; exit 2; }
  rm -rf "$out/package"
  mkdir -p "$out/package"
  git archive HEAD python | tar -x -C "$out/package" --strip-components=1
  # The _C deepspeed-unit.sh would test: the in-place build (scripts/dev-build.sh), else
  # .venv's; then checked against this commit's Python (its config schema).
  so=$(compgen -G "python/zerostream/_C*.so" | head -n1 || true)
  [ -n "$so" ] || so=$(.venv/bin/python -c 'import zerostream._C as c; print(c.__file__)')
  cp -L "$so" "$out/package/zerostream/"
  PYTHONPATH="$out/package" .venv/bin/python -c '
from zerostream.config import load
load({"train_batch_size": 1}, world_size=1, log=False)' \
    || { echo "deepspeed-unit-whole: $so does not match HEAD's python/ (run scripts/setup.sh)" >&2; exit 2; }
  git rev-parse --short HEAD > "$out/commit"
fi
echo "[deepspeed-unit-whole] zerostream at $(cat "$out/commit"), results in $out"
mapfile -t files < <(.venv/bin/python -c "
import sys; sys.path.insert(0, 'scripts')
from pathlib import Path
from deepspeed_unit_scope import in_scope_files
files = in_scope_files(Path('$checkout/tests'))
first = [f for f in '${ZS_DSUNIT_FIRST:-}'.split() if f in files]
print('\n'.join(first + [f for f in files if f not in first]))")
for f in "${files[@]}"; do
  scripts/deepspeed-unit.sh --peer "$checkout" --files "$f" --chunk 1 --resume \
    --keep "$out/deepspeed" --json "$out/last-deepspeed.json" "$@"
  ZS_DSUNIT_COMMIT=$(cat "$out/commit") ZS_DSUNIT_PACKAGE="$out/package" \
    scripts/deepspeed-unit.sh "$checkout" --files "$f" \
    --chunk 1 --resume --keep "$out/zerostream" --json "$out/last-zerostream.json" "$@"
done
# Every file done: the whole records from the kept reports (nothing runs again), and the count.
scripts/deepspeed-unit.sh --peer "$checkout" --chunk 1 --resume --keep "$out/deepspeed" \
  --json "$out/deepspeed.json" "$@"
ZS_DSUNIT_PACKAGE="$out/package" scripts/deepspeed-unit.sh "$checkout" --chunk 1 --resume \
  --keep "$out/zerostream" --json "$out/zerostream.json" "$@"
scripts/deepspeed-unit.sh --compare "$out/deepspeed.json" "$out/zerostream.json" \
  --json "$out/compare.json"
