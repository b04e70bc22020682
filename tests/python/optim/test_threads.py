"""The CPU optimizers' default thread count (zerostream/ops/threads.py): every core this
process may use, shared among the ranks of the node, without falling into torchrun's
OMP_NUM_THREADS=1; explicit settings win; bad values name their variable."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from zerostream.ops import threads as zt
from zerostream.ops._cpu_optimizer import run_kwargs
from zerostream.ops.adam import DeepSpeedCPUAdam

_VARS = (
    "ZS_OPTIM_THREADS",
    "OMP_NUM_THREADS",
    "LOCAL_WORLD_SIZE",
    "LOCAL_SIZE",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
)


@pytest.fixture
def env(monkeypatch):
    for v in _VARS:
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setattr(zt.os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(zt.os, "cpu_count", lambda: 16)  # the mask covers the machine
    zt._cache.clear()
    yield monkeypatch
    zt._cache.clear()


@pytest.mark.parametrize(
    "settings, expected, why",
    [
        ({}, 16, "16 cores available"),
        ({"LOCAL_WORLD_SIZE": "2", "OMP_NUM_THREADS": "1"}, 8, "/ 2 ranks on this node"),
        ({"LOCAL_SIZE": "3"}, 5, "(LOCAL_SIZE)"),
        ({"OMPI_COMM_WORLD_LOCAL_SIZE": "32"}, 1, "/ 32 ranks"),
        ({"OMP_NUM_THREADS": "1"}, 1, "OMP_NUM_THREADS"),  # one process: the user's 1
        ({"OMP_NUM_THREADS": "6", "LOCAL_WORLD_SIZE": "4"}, 6, "OMP_NUM_THREADS"),
        ({"ZS_OPTIM_THREADS": "3", "OMP_NUM_THREADS": "6"}, 3, "ZS_OPTIM_THREADS"),
        ({"OMP_NUM_THREADS": "4,2"}, 4, "OMP_NUM_THREADS"),  # nested list: outer level
    ],
)
def test_default_follows_the_documented_order(env, settings, expected, why):
    for k, v in settings.items():
        env.setenv(k, v)
    count, reason = zt.resolve(None)
    assert count == expected
    assert why in reason


@pytest.mark.parametrize(
    "machine, expected, why",
    [
        (64, 16, "16 cores bound to this rank"),  # 16 of 64 CPUs = one rank's share: numactl
        (20, 4, "16 cores available / 4 ranks"),  # a 16-CPU cpuset the 4 ranks share
    ],
)
def test_a_mask_of_one_ranks_share_is_that_ranks_own(env, machine, expected, why):
    env.setattr(zt.os, "cpu_count", lambda: machine)
    env.setenv("LOCAL_WORLD_SIZE", "4")
    env.setenv("OMP_NUM_THREADS", "1")
    count, reason = zt.resolve(None)
    assert (count, why in reason) == (expected, True), reason


def test_explicit_threads_win(env):
    env.setenv("ZS_OPTIM_THREADS", "3")
    assert zt.resolve(7) == (7, "threads= argument")
    assert run_kwargs(5, None, "auto")["threads"] == 5
    assert run_kwargs(None, None, "auto")["threads"] == 3
    assert run_kwargs(0, None, "auto")["threads"] == 3


@pytest.mark.parametrize("var", ["ZS_OPTIM_THREADS", "OMP_NUM_THREADS", "LOCAL_WORLD_SIZE"])
def test_bad_values_name_the_variable(env, var):
    env.setenv(var, "zero")
    with pytest.raises(ValueError, match=f"{var}: expected a positive integer"):
        zt.resolve(None)


def test_the_optimizer_logs_its_choice_once(env, caplog):
    env.setenv("LOCAL_WORLD_SIZE", "2")
    env.setenv("OMP_NUM_THREADS", "1")
    zt._logged.clear()
    logger = logging.getLogger("zerostream")
    logger.addHandler(caplog.handler)
    try:
        p = torch.nn.Parameter(torch.ones(10))
        p.grad = torch.ones(10)
        opt = DeepSpeedCPUAdam([p])
        opt.step()
        opt.step()
    finally:
        logger.removeHandler(caplog.handler)
    lines = [r.getMessage() for r in caplog.records if "CPU optimizer" in r.getMessage()]
    assert lines == [
        "CPU optimizer: 8 threads (16 cores available / 2 ranks on this node (LOCAL_WORLD_SIZE))"
    ]


def test_real_affinity_is_used(monkeypatch):
    for v in _VARS:
        monkeypatch.delenv(v, raising=False)
    zt._cache.clear()
    assert zt.resolve(None)[0] == len(os.sched_getaffinity(0))
    zt._cache.clear()


def test_a_thread_beside_the_backward_leaves_one_core(env):
    """zero/speculate.py's thread calls leave_one_core(): its kernels use one thread fewer
    (at least one), other threads keep the whole count."""
    import threading

    seen = {}

    def beside(name, explicit):
        zt.leave_one_core()
        seen[name] = zt.optimizer_threads(explicit)

    for name, explicit in (("default", None), ("one", 1), ("four", 4)):
        t = threading.Thread(target=beside, args=(name, explicit))
        t.start()
        t.join()
    assert seen == {"default": 15, "one": 1, "four": 3}
    assert zt.optimizer_threads() == 16  # this thread left none
