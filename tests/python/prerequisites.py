"""What some tiers need from outside the project (DeepSpeed itself as a peer, the shared
compatibility corpus, transformers), and what a test does when it is missing: on a
developer's machine it skips, saying why; in CI (CI=true, and always under scripts/test.sh,
which sets everything up) it fails, so a tier cannot switch itself off unnoticed."""

import functools
import os
import pathlib
import subprocess
from typing import NoReturn, Optional

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]

# scripts/deepspeed-peer.sh makes .venv-deepspeed (run by scripts/test.sh); scripts/bench.sh
# makes .venv-bench, which has DeepSpeed too. ZS_DEEPSPEED_PYTHON names another interpreter.
_CANDIDATES = (REPO / ".venv-deepspeed" / "bin" / "python", REPO / ".venv-bench" / "bin" / "python")


def strict() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def missing(reason: str, allow_module_level: bool = False) -> NoReturn:
    """Skips with `reason`, or fails with it in CI."""
    if strict():
        pytest.fail(f"a prerequisite is missing in CI (CI=true): {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=allow_module_level)


@functools.lru_cache(maxsize=None)  # one probe (an import of DeepSpeed, seconds) a session
def deepspeed_python() -> Optional[str]:
    """An interpreter that imports DeepSpeed itself (never the compatibility package), or
    None."""
    wanted = os.environ.get("ZS_DEEPSPEED_PYTHON")
    for python in [pathlib.Path(wanted)] if wanted else _CANDIDATES:
        if not python.exists():
            continue
        probe = subprocess.run(
            [str(python), "-c", "import deepspeed; print(deepspeed.__version__)"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        lines = probe.stdout.strip().splitlines()
        if probe.returncode == 0 and lines and "zerostream" not in lines[-1]:
            return str(python)
    return None


def require_deepspeed_python() -> str:
    python = deepspeed_python()
    if python is None:
        missing(
            "no interpreter with DeepSpeed itself: scripts/deepspeed-peer.sh makes "
            ".venv-deepspeed (scripts/test.sh runs it), or set ZS_DEEPSPEED_PYTHON"
        )
    return python
