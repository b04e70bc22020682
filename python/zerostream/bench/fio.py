"""fio, the benches' disk peer: one way to run it and read its JSON (`bench io`, `bench
checkpoint` and the capacity compare each choose their own job options)."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import List

MISSING = "fio is not installed (apt-get install fio)"


def available() -> bool:
    return shutil.which("fio") is not None


def run(options: List[str], timeout: int = 1800) -> List[dict]:
    """Runs `fio <options> --output-format=json` and returns its jobs (one dict each, as
    fio's JSON has them); a clear error when fio is missing or fails."""
    if not available():
        raise RuntimeError(MISSING)
    done = subprocess.run(
        ["fio", "--output-format=json", *options], capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        raise RuntimeError(f"fio failed: {done.stderr.strip() or done.stdout[-500:]}")
    # fio may print notices before the JSON document
    return json.loads(done.stdout[done.stdout.index("{") :])["jobs"]


def gb_per_s(job: dict, op: str) -> float:
    """A job's bandwidth in direction `op` ("read" or "write"), GB/s."""
    return job[op]["bw_bytes"] / 1e9
