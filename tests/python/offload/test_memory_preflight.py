"""Host-memory preflight (reliability item 5): the /proc and cgroup readers on fake trees and on
this machine, the documented override, and initialize refusing an offloaded optimizer state
that does not fit, with both numbers and the advice, on every rank."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

import zerostream
from zerostream.offload import memory_preflight as hm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mlp import MLP  # noqa: E402
from multirank import run_ranks  # noqa: E402


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# --- readers -------------------------------------------------------------------------------


def test_mem_available_reads_kib_from_meminfo(tmp_path):
    f = tmp_path / "meminfo"
    f.write_text("MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   1234 kB\n")
    assert hm.mem_available(str(f)) == 1234 * 1024
    f.write_text("MemTotal:       24000000 kB\n")  # kernels before 3.14 have no MemAvailable
    assert hm.mem_available(str(f)) is None
    assert hm.mem_available(str(tmp_path / "missing")) is None


def test_cgroup_v2_takes_the_tightest_limit_up_the_tree(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("0::/job/step\n")
    root = tmp_path / "sys"
    _write(root / "job/step/memory.max", "1000\n")
    _write(root / "job/step/memory.current", "300\n")
    _write(root / "job/memory.max", "500\n")  # the job's limit is the tighter one
    _write(root / "job/memory.current", "450\n")
    _write(root / "memory.current", "999999\n")  # the root has no memory.max
    assert hm.cgroup_room(str(proc), str(root)) == 50
    _write(root / "job/memory.max", "max\n")
    assert hm.cgroup_room(str(proc), str(root)) == 700
    _write(root / "job/step/memory.max", "max\n")
    assert hm.cgroup_room(str(proc), str(root)) is None  # no limit anywhere


def test_cgroup_v1_memory_controller(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("12:cpu,cpuacct:/x\n5:memory:/docker/abc\n")
    root = tmp_path / "sys"
    _write(root / "memory/docker/abc/memory.limit_in_bytes", str(8 << 30))
    _write(root / "memory/docker/abc/memory.usage_in_bytes", str(3 << 30))
    assert hm.cgroup_room(str(proc), str(root)) == 5 << 30
    _write(root / "memory/docker/abc/memory.limit_in_bytes", str(2**63 - 4096))  # "no limit"
    assert hm.cgroup_room(str(proc), str(root)) is None


def test_the_real_readers_agree_with_the_machine(monkeypatch):
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    available = hm.mem_available()
    assert available is not None and 0 < available <= total
    room = hm.cgroup_room()
    assert room is None or room >= 0
    # MemAvailable moves between two reads (CI once saw it differ by 3.5 MB), so the
    # combination is checked on the values just read, replayed to usable_host_bytes.
    monkeypatch.setattr(hm, "mem_available", lambda: available)
    monkeypatch.setattr(hm, "cgroup_room", lambda: room)
    usable, source = hm.usable_host_bytes()
    assert usable == min(x for x in (available, room) if x is not None)
    assert source == (
        "the cgroup memory limit" if room is not None and room < available else "MemAvailable"
    )


def test_the_override_is_parsed_and_a_bad_one_is_named(monkeypatch):
    monkeypatch.setenv(hm.ENV, "1.5G")
    assert hm.usable_host_bytes() == (3 << 29, hm.ENV)
    monkeypatch.setenv(hm.ENV, "lots")
    with pytest.raises(ValueError, match=rf"{hm.ENV}: expected bytes or a size like 64G"):
        hm.usable_host_bytes()


# --- initialize ----------------------------------------------------------------------------


def _initialize(offload="cpu", stage=2, bf16=False):
    torch.manual_seed(0)
    model = MLP()
    cfg = {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": stage, "offload_optimizer": {"device": offload}},
        "bf16": {"enabled": bf16},
    }
    return zerostream.initialize(model=model, model_parameters=model.parameters(), config=cfg)


@pytest.mark.usefixtures("one_rank_process_group")
@pytest.mark.parametrize("stage,bf16", [(1, False), (2, False), (3, False), (2, True), (3, True)])
def test_an_optimizer_state_that_does_not_fit_fails_with_both_numbers(monkeypatch, stage, bf16):
    # fp32 masters, Adam's moments and gradients: fp32, or bf16 when they land 16-bit.
    per = 14 if bf16 else 16
    numel = sum(p.numel() for p in MLP().parameters())
    monkeypatch.setenv(hm.ENV, "1000")
    with pytest.raises(MemoryError) as err:
        _initialize(stage=stage, bf16=bf16)
    msg = str(err.value)
    held = int(msg.split(f" elements per rank x {per} bytes")[0].rsplit("(", 1)[1])
    assert numel <= held < numel + 64  # this rank's partition (padding at most an alignment)
    assert f"({per * held} bytes)" in msg
    assert f"may use 0.00 GiB (1000 bytes, from {hm.ENV})" in msg
    assert '"nvme"' in msg and "more ranks" in msg and "nothing was allocated" in msg
    monkeypatch.setenv(hm.ENV, "1G")
    engine, *_ = _initialize(stage=stage, bf16=bf16)  # fits under a larger limit
    assert engine.optimizer.state_summary()["offload"] == "cpu"
    assert engine.optimizer.grads[0].dtype == (torch.bfloat16 if bf16 else torch.float32)


@pytest.mark.usefixtures("one_rank_process_group")
@pytest.mark.parametrize("bf16,per", [(False, 8), (True, 16)])
def test_a_stage0_state_that_does_not_fit_in_host_memory_is_refused(monkeypatch, bf16, per):
    """Stage 0 on the CPU path: the whole state on every rank, in host memory."""
    numel = sum(p.numel() for p in MLP().parameters())

    def initialize():
        torch.manual_seed(0)
        model = MLP().to(torch.bfloat16) if bf16 else MLP()
        cfg = {
            "train_micro_batch_size_per_gpu": 2,
            "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
            "zero_optimization": {"stage": 0},
            "bf16": {"enabled": bf16},
        }
        return zerostream.initialize(model=model, config=cfg)

    monkeypatch.setenv(hm.ENV, str(per * numel - 1))
    with pytest.raises(MemoryError) as err:
        initialize()
    msg = str(err.value)
    assert f"ZeRO stage 0, whole on every rank ({numel} elements per rank x {per} bytes)" in msg
    assert f"needs {per * numel / 2**30:.2f} GiB of host memory ({per * numel} bytes)" in msg
    assert f"({per * numel - 1} bytes, from {hm.ENV})" in msg and "zero_optimization.stage" in msg
    monkeypatch.setenv(hm.ENV, str(per * numel))  # exactly enough
    engine, *_ = initialize()
    assert engine.zero_optimization_stage() == 0


@pytest.mark.usefixtures("one_rank_process_group")
def test_ranks_of_one_host_are_counted_together(monkeypatch):
    numel = sum(p.numel() for p in MLP().parameters())
    monkeypatch.setenv(hm.ENV, str(16 * numel * 3))  # room for three ranks' state, not four
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    with pytest.raises(MemoryError, match=r"x 4 ranks on this host"):
        _initialize(stage=1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    _initialize(stage=1)


def _two_rank_worker(rank, world):
    if rank == 1:
        os.environ[hm.ENV] = "1000"
    try:
        _initialize(stage=2)
    except MemoryError as e:
        return str(e)
    return "no error"


@pytest.mark.multirank
def test_every_rank_stops_when_one_rank_is_short():
    r0, r1 = run_ranks(_two_rank_worker, 2, timeout=120, env={"LOCAL_WORLD_SIZE": "1"})
    assert r1.startswith("[rank 1]") and "1000 bytes" in r1
    assert r0.startswith("[rank 0]") and "global rank 1" in r0
