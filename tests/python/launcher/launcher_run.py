"""Runs `python -m zerostream.launcher ...` as a user would: a real launcher process, its real
ranks, the zerostream this test run imported (the installed package under scripts/test.sh, the
checkout's python/ in a developer loop) on PYTHONPATH and no launcher variables inherited from
the test run."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Dict, List, Optional

import zerostream

HERE = pathlib.Path(__file__).resolve().parent
# Where the imported zerostream lives: a clean clone's python/ has no built _C, so putting the
# checkout first would shadow the installed package the test run is testing.
ZS_SITE = pathlib.Path(zerostream.__file__).resolve().parents[1]
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "LOCAL_SIZE", "MASTER_")
LAUNCH_TIMEOUT_S = 110  # under the tests' pytest-timeout, so a hang reports its output


def clean_env(**extra: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_VARS)}
    env.pop("OMP_NUM_THREADS", None)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ZS_SITE)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    return {**env, **extra}


def launch(
    args: List[str], out_dir: pathlib.Path, cwd: Optional[pathlib.Path] = None, **env: str
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "zerostream.launcher", *args],
        cwd=str(cwd or out_dir),
        env=clean_env(PROBE_OUT=str(out_dir), **env),
        capture_output=True,
        text=True,
        timeout=LAUNCH_TIMEOUT_S,
    )


def records(out_dir: pathlib.Path, world: int) -> List[dict]:
    """What each rank of probe.py wrote, by rank."""
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world)]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
