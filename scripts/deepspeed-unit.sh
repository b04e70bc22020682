#!/usr/bin/env bash
# Runs DeepSpeed's own unit tests (`tests/unit` of a DeepSpeed checkout) on the CPU against a
# `deepspeed` package, and records every test's outcome as JSON under build/deepspeed-unit/:
#
#   scripts/deepspeed-unit.sh CHECKOUT [--files unit/a.py ...] [--json OUT] [--keep DIR]
#       zerostream's compatibility package
#   scripts/deepspeed-unit.sh --peer CHECKOUT [--files ...]
#       DeepSpeed itself (0.19.8 from PyPI in .venv-deepspeed, scripts/deepspeed-peer.sh)
#   scripts/deepspeed-unit.sh --compare build/deepspeed-unit/deepspeed.json \
#       build/deepspeed-unit/zerostream.json
#       the count: of the tests DeepSpeed passes here, how many zerostream passes
#   scripts/deepspeed-unit.sh CHECKOUT --collect     imports every file, runs nothing
#   scripts/deepspeed-unit.sh --setup                makes .venv-dsunit only
#
# Only the checkout's tests/ folder is read, copied to a scratch folder (its conftest puts the
# checkout's root first on sys.path, where a source tree's `deepspeed/` would shadow the
# package under test). It runs in .venv-dsunit, which holds the pytest DeepSpeed pins (< 8.4)
# and py-cpuinfo and reads everything else from .venv through a path entry; with --peer,
# .venv-deepspeed's site-packages come first on the path, so `import deepspeed` is DeepSpeed
# (the run checks which it got). Which files run is scripts/deepspeed_unit_scope.py (all of
# tests/unit but the features zerostream refuses by name). Not part of scripts/test.sh: a
# full run of either package takes hours on 2 cores.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
[ -x .venv/bin/python ] || scripts/setup.sh
setup_only=0 peer=0
case "${1:-}" in
  --setup) setup_only=1 ;;
  --peer) peer=1; shift ;;
esac
venv=.venv-dsunit
pins=(pytest==8.3.5 py-cpuinfo==9.0.0)
stamp=$venv/.zs-dsunit.sha1
want=$( (printf '%s\n' "${pins[@]}"; .venv/bin/python -c 'import sys; print(sys.version)') | sha1sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2> /dev/null)" != "$want" ]; then
  echo "[deepspeed-unit] creating $venv (DeepSpeed's test pins beside .venv)"
  scripts/side-venv.sh "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps "${pins[@]}"
  echo "$want" > "$stamp"
fi
[ "$setup_only" = 1 ] && exit 0
if [ "$peer" = 1 ]; then
  # DeepSpeed JIT-builds its async_io op against libaio's headers (as scripts/bench.sh's peer);
  # without them its aio and NVMe tests skip themselves and leave the count.
  source scripts/apt.sh
  LOG_PREFIX=deepspeed-unit apt_ensure libaio-dev
  scripts/deepspeed-peer.sh
  site=$(.venv-deepspeed/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  export PYTHONPATH="$site"
  # The launcher tests run the `deepspeed` command: DeepSpeed's own.
  export PATH="$root/.venv-deepspeed/bin:$PATH"
  exec "$venv/bin/python" scripts/deepspeed_unit.py --package deepspeed "$@"
fi
# ZS_DSUNIT_PACKAGE: a copy of python/ (with its _C) to test, so that a run of hours tests one
# commit while the work tree changes (scripts/deepspeed-unit-whole.sh). Else the working
# tree's package when it is built in place (scripts/dev-build.sh), else .venv's.
if [ -n "${ZS_DSUNIT_PACKAGE:-}" ]; then
  export PYTHONPATH="$ZS_DSUNIT_PACKAGE/deepspeed_compat:$ZS_DSUNIT_PACKAGE${PYTHONPATH:+:$PYTHONPATH}"
elif compgen -G "python/zerostream/_C*.so" > /dev/null; then
  export PYTHONPATH="$root/python/deepspeed_compat:$root/python${PYTHONPATH:+:$PYTHONPATH}"
fi
# The launcher tests run the `deepspeed` command: the compatibility package's, in .venv.
export PATH="$root/.venv/bin:$PATH"
exec "$venv/bin/python" scripts/deepspeed_unit.py --package zerostream "$@"
