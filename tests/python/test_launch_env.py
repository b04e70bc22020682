"""Environment handling of a run started without a launcher (reliability issue, items 11 and
13): variables are read when used and a bad one is named; single-process runs share no port."""

import os
import socket
import subprocess
import sys

import pytest

LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "SLURM_", "OMPI_", "PMI_")

SINGLE_RUN = (
    "import time, torch, zerostream\n"
    "zerostream.init_distributed()\n"
    "t = torch.ones(3)\n"
    "zerostream.comm.all_reduce(t)\n"
    "time.sleep(2)  # hold the group while the other run starts\n"
    "print('ok', float(t.sum()))\n"
)


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_VARS)}
    env.pop("DEEPSPEED_TIMEOUT", None)
    return {**env, **extra}


@pytest.mark.slow  # CI's 25 minutes
def test_two_single_process_runs_on_one_machine_do_not_collide():
    # Something else holds DeepSpeed's default port, as a first job would.
    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", 29500))
        holder.listen()
    except OSError:
        pass  # already taken on this machine: the same situation
    try:
        runs = [
            subprocess.Popen(
                [sys.executable, "-c", SINGLE_RUN],
                env=_clean_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        outs = [r.communicate(timeout=120) for r in runs]
    finally:
        holder.close()
    for run, (out, err) in zip(runs, outs):
        assert run.returncode == 0, err
        assert out.strip() == "ok 3.0", out + err


def _child(code: str, **env) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter with no launcher variables plus `env`."""
    return subprocess.run(
        [sys.executable, "-c", code],
        env=_clean_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_bad_deepspeed_timeout_is_named_when_used_not_at_import():
    code = (
        "import zerostream\n"  # must not fail here
        "try:\n"
        "    zerostream.init_distributed()\n"
        "except ValueError as e:\n"
        "    print('ValueError:', e)\n"
    )
    done = _child(code, DEEPSPEED_TIMEOUT="30s")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "ValueError: DEEPSPEED_TIMEOUT: expected a positive number of minutes (such as 30 or "
        "0.5); got '30s'"
    )


def test_deepspeed_timeout_is_read_in_minutes():
    done = _child(
        "from zerostream import comm\nprint(comm.default_timeout().total_seconds())\n",
        DEEPSPEED_TIMEOUT="0.5",
    )
    assert done.stdout.strip() == "30.0", done.stderr
