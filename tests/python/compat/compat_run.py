"""Running Python in a subprocess with the compat package installed (conftest.compat_env)."""

import subprocess
import sys

import pytest


def run_python(args, env: dict, timeout: float = 300, cwd=None) -> subprocess.CompletedProcess:
    """`python ARGS` with `env`; fails the test with its output when it fails."""
    done = subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd
    )
    if done.returncode != 0:
        pytest.fail(
            f"python {' '.join(map(str, args))} exited {done.returncode}\n"
            f"--- stdout\n{done.stdout[-6000:]}\n--- stderr\n{done.stderr[-8000:]}"
        )
    return done
