#!/usr/bin/env bash
# scripts/side-venv.sh VENV: makes VENV afresh, a virtual environment of .venv's Python whose
# own site-packages come first and which reads everything else from .venv's through a path
# entry (torch and the rest are not installed twice). Sourced by the scripts that keep a
# package set apart from .venv: scripts/deepspeed-peer.sh (DeepSpeed itself) and
# scripts/deepspeed-unit.sh (DeepSpeed's test pins). Run from the repository root.
set -euo pipefail
venv=$1
rm -rf "$venv"
base=$(.venv/bin/python -c 'import sys; print(sys.base_prefix)')
"$base/bin/python3" -m venv "$venv"
own=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
shared=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$shared" > "$own/zs-project-env.pth"
