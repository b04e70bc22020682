#!/usr/bin/env bash
# Makes .venv-deepspeed: DeepSpeed 0.19.8 itself (from PyPI, no prebuilt ops), for the tests
# that compare with it (checkpoint migration both ways, DeepSpeed's zero_to_fp32 on our
# checkpoints, the estimator tables). It never touches .venv: DeepSpeed and the few packages
# of its own it needs go into this environment's site-packages, and torch and the rest come
# from .venv through a path entry appended after them, so nothing is downloaded twice and
# the real `deepspeed` shadows the compatibility package .venv holds. Idempotent; run by
# scripts/test.sh after scripts/setup.sh. scripts/bench.sh keeps its own full .venv-bench.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
venv=.venv-deepspeed
pins=(deepspeed==0.19.8 einops==0.8.2 msgpack==1.2.4 ninja==1.13.2 py-cpuinfo==9.0.0)
stamp=$venv/.zs-peer.sha1
want=$( (printf '%s\n' "${pins[@]}"; .venv/bin/python -c 'import sys; print(sys.version)') | sha1sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
echo "[deepspeed-peer] creating $venv (DeepSpeed 0.19.8 beside .venv's torch)"
scripts/side-venv.sh "$venv"
# The venv's own setuptools (ensurepip's, 65.x on Python 3.11) would shadow .venv's pinned one
# and cannot build DeepSpeed's sdist without the `wheel` package ("invalid command
# 'bdist_wheel'"); a pip with a cached DeepSpeed wheel never builds it, a clean machine does.
"$venv/bin/python" -m pip uninstall -y -q --disable-pip-version-check setuptools 2> /dev/null || true
DS_BUILD_OPS=0 "$venv/bin/python" -m pip install -q --disable-pip-version-check \
  --no-build-isolation --ignore-installed --no-deps "${pins[@]}"
probe=$("$venv/bin/python" -c 'import deepspeed; print(deepspeed.__version__, deepspeed.__file__)' 2>&1 | tail -1 || true)
case "$probe" in
  "0.19.8 $root/$venv/"*) ;;
  *) echo "[deepspeed-peer] $venv imports the wrong deepspeed: $probe" >&2; exit 1 ;;
esac
echo "$want" > "$stamp"
