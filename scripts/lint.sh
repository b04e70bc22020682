#!/usr/bin/env bash
# Checks, without changing anything, that the C++ is formatted (clang-format, .clang-format)
# and that the Python passes ruff's lint rules and formatter ([tool.ruff] in pyproject.toml)
# and the type checker ([tool.mypy]). The tools are pinned, since another version formats or
# flags differently: clang-format-14 from Debian 12 (installed here if missing), ruff and mypy
# from requirements.txt (.venv, made by scripts/setup.sh). Called by scripts/test.sh; safe to run by hand.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

source scripts/apt.sh
LOG_PREFIX=lint apt_ensure clang-format-14
ruff=${ZS_RUFF:-.venv/bin/ruff}
if [ ! -x "$ruff" ]; then
  echo "[lint] $ruff not found: run scripts/setup.sh (ruff is pinned in requirements.txt)" >&2
  exit 1
fi

cxx_sources() {
  find common csrc zero offload tests/cpp -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' \) \
    -print0 | sort -z
}

status=0
echo "[lint] clang-format $(clang-format-14 --version | grep -o '[0-9][0-9.]*' | head -n1)"
# --Werror makes "would reformat" fail; each place that would change is printed.
cxx_sources | xargs -0 clang-format-14 --dry-run --Werror || status=1
echo "[lint] $("$ruff" --version)"
"$ruff" check --no-cache python tests examples benchmarks || status=1
"$ruff" format --no-cache --check python tests examples benchmarks || status=1
# The type checker ([tool.mypy] in pyproject.toml: what it checks, how strictly, and the
# modules not yet clean), pinned beside ruff.
mypy=${ZS_MYPY:-.venv/bin/mypy}
echo "[lint] $("$mypy" --version)"
"$mypy" --cache-dir build/mypy-cache || status=1

if [ "$status" -ne 0 ]; then
  cat >&2 <<MSG
[lint] failed. The formatters apply layout, ruff --fix what it can (imports, whitespace);
the remaining ruff findings need an edit:
  find common csrc zero offload tests/cpp -type f \\( -name '*.h' -o -name '*.cpp' -o -name '*.cu' \\) -print0 | xargs -0 clang-format-14 -i
  $ruff check --fix python tests examples && $ruff format python tests examples
MSG
fi
exit "$status"
