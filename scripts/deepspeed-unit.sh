#!/usr/bin/env bash
# Runs DeepSpeed's own unit tests (`tests/unit` of a DeepSpeed checkout) against zerostream's
# `deepspeed` package on the CPU, and prints the pass rate the way docs/compat.md records it:
#
#   scripts/deepspeed-unit.sh /path/to/DeepSpeed [--files unit/a.py ...] [--json OUT] [--keep DIR]
#
# DeepSpeed itself is never installed or imported: only its tests/ folder is copied to a
# scratch folder (its conftest puts the checkout's root first on sys.path, where the real
# `deepspeed/` would shadow the package), and it runs in .venv-dsunit, which holds the pytest
# DeepSpeed pins (< 8.4) and py-cpuinfo and reads everything else from .venv through a path
# entry. Which files are run, and why each failure fails, is scripts/deepspeed_unit.py's
# manifest. Not part of scripts/test.sh: a full run takes about 2 hours on 2 cores.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
[ -x .venv/bin/python ] || scripts/setup.sh
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
# The working tree's package when it is built in place (scripts/dev-build.sh), else .venv's.
if compgen -G "python/zerostream/_C*.so" > /dev/null; then
  export PYTHONPATH="$root/python/deepspeed_compat:$root/python${PYTHONPATH:+:$PYTHONPATH}"
fi
exec "$venv/bin/python" scripts/deepspeed_unit.py "$@"
