"""Disk exhaustion (reliability item 3), on a real 16 MiB ext4 image where the kernel says no:
the swap layout is checked against the free space before a byte is written, extents are sized
by the tensor (not the block size), alignment and block size are validated, a failed
preallocation gives its blocks back, and EFBIG is not called "out of space"."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import zerostream
from zerostream.offload.io_engine import IoEngine, IoError
from zerostream.offload.swap_store import SwapStore

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KEY = "zero_optimization.offload_optimizer.nvme_path"


def _free(path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _swap_files(root) -> list:
    return sorted(str(p) for p in Path(root).rglob("swap_*.bin"))


class Wide(torch.nn.Module):
    """1536 x 1536 + 1536 = 2.36 M parameters: 28 MB of fp32 Adam state, more than the disk."""

    def __init__(self, n=1536):
        super().__init__()
        self.lin = torch.nn.Linear(n, n)

    def forward(self, x):
        return self.lin(x).pow(2).mean()


def _initialize(model, nvme):
    cfg = {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
        "zero_optimization": {
            "stage": 1,
            "offload_optimizer": {"device": "nvme", "nvme_path": nvme},
        },
    }
    return zerostream.initialize(model=model, model_parameters=model.parameters(), config=cfg)


@pytest.mark.usefixtures("one_rank_process_group")
def test_initialize_refuses_a_layout_the_disk_cannot_hold_before_writing(full_disk):
    before = _free(full_disk)
    with pytest.raises(OSError) as err:
        _initialize(Wide(), full_disk)
    assert err.value.errno == errno.ENOSPC
    msg = err.value.strerror
    assert msg.startswith(KEY) and "nothing was written" in msg
    needed = int(msg.split(" need ")[1].split(" bytes")[0])
    assert needed >= 12 * (1536 * 1536 + 1536)  # p, m and v in fp32
    free_then = int(msg.split(" has ")[1].split(" bytes free")[0])
    assert before - (64 << 10) <= free_then <= before  # less only the directories' blocks
    assert _swap_files(full_disk) == []  # the store's files are gone
    assert _free(full_disk) == before  # and the disk is as it was


@pytest.mark.usefixtures("one_rank_process_group")
def test_ranks_sharing_the_disk_are_counted(full_disk, monkeypatch):
    # One rank's state (~7 MB) fits in 16 MiB; four ranks of this host on the same disk do not.
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    with pytest.raises(OSError, match=r"4 ranks on this host x \d+ bytes"):
        _initialize(Wide(768), full_disk)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    engine, *_ = _initialize(Wide(768), full_disk)
    assert len(_swap_files(full_disk)) > 0
    engine.destroy()


def test_extents_are_sized_by_the_tensor_not_the_block_size(tmp_path):
    engine = IoEngine(block_size=1 << 30, queue_depth=4)  # a legal, huge aio.block_size
    store = SwapStore(engine, tmp_path, grow_bytes=0)
    for i in range(10):
        store.write(i, torch.ones(1000, dtype=torch.float32)).wait()
    stats = store.stats()
    assert stats["used_bytes"] == 10 * 4096  # 4000 bytes each, rounded to 4 KiB
    assert stats["file_bytes"] <= 10 * 4096
    assert store.bytes_needed([4000, 4096, 4097]) == 4096 + 4096 + 8192
    store.close()


@pytest.mark.parametrize("align", [1 << 40, 12288, 512, -4096])
def test_bad_alignment_is_refused_naming_the_value(tmp_path, align):
    engine = IoEngine()
    with pytest.raises(ValueError, match=rf"alignment must be a power of two .*got {align}"):
        SwapStore(engine, tmp_path, align=align)
    assert _swap_files(tmp_path) == []


@pytest.mark.parametrize("block", [256, 12288, 3 << 20, 2 << 30])
def test_block_size_must_be_a_power_of_two_within_bounds(block):
    with pytest.raises(ValueError, match=rf"aio.block_size: expected a power of two.*got {block}"):
        IoEngine(block_size=block)


def test_a_failed_preallocation_gives_its_blocks_back(full_disk):
    engine = IoEngine(block_size=1 << 20, queue_depth=8)
    store = SwapStore(engine, full_disk, files=1, grow_bytes=0)
    store.write(0, torch.ones(1 << 18, dtype=torch.float32)).wait()  # 1 MiB
    before = _free(full_disk)
    size_before = os.path.getsize(_swap_files(full_disk)[0])
    with pytest.raises(IoError) as err:
        store.write(1, torch.ones(8 << 20, dtype=torch.float32)).wait()  # 32 MiB > the disk
    assert err.value.errno == errno.ENOSPC and "out of space" in str(err.value)
    assert _free(full_disk) == before  # ext4 keeps what a failed fallocate took: given back
    assert os.path.getsize(_swap_files(full_disk)[0]) == size_before
    back = torch.empty(1 << 18, dtype=torch.float32)
    store.read(0, back).wait()
    assert torch.equal(back, torch.ones(1 << 18))
    store.close()
    assert _swap_files(full_disk) == []


def test_efbig_is_not_called_out_of_space(tmp_path):
    """A file-size limit (RLIMIT_FSIZE) makes the kernel answer EFBIG, which is a different
    problem from a full disk and must read as one."""
    script = textwrap.dedent(
        f"""
        import resource, signal, torch
        from zerostream.offload.io_engine import IoEngine, IoError
        from zerostream.offload.swap_store import SwapStore
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4 << 20, 4 << 20))
        store = SwapStore(IoEngine(), {str(tmp_path)!r}, grow_bytes=64 << 20)
        store.write(0, torch.ones(1 << 18)).wait()  # 1 MiB: the 64 MiB step falls back
        try:
            store.write(1, torch.ones(2 << 20)).wait()  # 8 MiB: past the limit
        except IoError as e:
            print(e.errno, e)
        store.close()
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    code, _, msg = r.stdout.strip().partition(" ")
    assert int(code) == errno.EFBIG
    assert "out of space" not in msg and "largest file size" in msg
    assert _swap_files(tmp_path) == []


@pytest.mark.usefixtures("one_rank_process_group")
def test_stage3_parameter_shards_are_checked_against_the_disk_too(full_disk, tmp_path):
    before = _free(full_disk)
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(5)])  # 21 MB fp32
    cfg = {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
        "zero_optimization": {
            "stage": 3,
            "offload_param": {"device": "nvme", "nvme_path": full_disk, "max_in_cpu": 0},
            "offload_optimizer": {"device": "nvme", "nvme_path": str(tmp_path)},
        },
    }
    with pytest.raises(OSError) as err:
        zerostream.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    assert err.value.errno == errno.ENOSPC
    assert err.value.strerror.startswith("zero_optimization.offload_param.nvme_path")
    assert _swap_files(full_disk) == [] and _free(full_disk) == before
