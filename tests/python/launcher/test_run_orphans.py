"""Ranks die with their agent (issue 32, Note [Ranks die with their agent] in
launcher/_child.py): a `kill -9` of `zerostream run` must not leave its ranks running, and a
--no_python program (exec'd by the rank start-up) is covered too."""

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
from launcher_run import clean_env

SLEEPER = """
import os, pathlib, sys, time
out = pathlib.Path(sys.argv[1])
(out / f"rank{os.environ['RANK']}.pid").write_text(str(os.getpid()))
while True:
    time.sleep(0.2)
"""


def pid_alive(pid: int) -> bool:
    """Running, not a zombie: a killed orphan stays a zombie until whoever adopted it reaps it,
    which a container's PID 1 may never do."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait(predicate, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def _rank_pids(out: pathlib.Path, world: int):
    files = [out / f"rank{r}.pid" for r in range(world)]
    if not all(f.exists() and f.read_text() for f in files):
        return None
    return [int(f.read_text()) for f in files]


@pytest.mark.parametrize("no_python", [False, True], ids=["script", "no_python"])
def test_kill_9_of_the_agent_takes_its_ranks_with_it(tmp_path, no_python):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    if no_python:
        target = ["--no_python", sys.executable, str(script), str(tmp_path)]
    else:
        target = [str(script), str(tmp_path)]
    agent = subprocess.Popen(
        [sys.executable, "-m", "zerostream.launcher", "--nproc", "2", "--no_local_rank", *target],
        cwd=str(tmp_path),
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        assert _wait(lambda: _rank_pids(tmp_path, 2) is not None, 60), (
            "the ranks did not start",
            agent.stderr.read().decode() if agent.poll() is not None else "",
        )
        pids = _rank_pids(tmp_path, 2)
        assert all(pid_alive(p) for p in pids)
        # Each rank runs in a session of its own (elastic's), so only the kernel's
        # parent-death signal can reach it once the agent is gone.
        assert all(os.getsid(p) != os.getsid(agent.pid) for p in pids)
        agent.send_signal(signal.SIGKILL)
        agent.wait(timeout=10)
        gone = _wait(lambda: not any(pid_alive(p) for p in pids), 10)
        assert gone, f"ranks {[p for p in pids if pid_alive(p)]} outlived their agent"
    finally:
        if agent.poll() is None:
            agent.kill()
        for p in _rank_pids(tmp_path, 2) or []:
            if pid_alive(p):
                os.kill(p, signal.SIGKILL)
