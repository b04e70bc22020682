"""The swap store through Python: layout on disk, round trips, checksums, env fault hook."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from zerostream import _C
from zerostream.config import load
from zerostream.offload.io_engine import IoEngine, IoError, io_config, io_config_for
from zerostream.offload.swap_store import SwapStore


@pytest.fixture(params=["io_uring", "threads"])
def engine(request):
    return IoEngine(block_size=1 << 16, queue_depth=8, threads=2, backend=request.param)


def test_layout_and_round_trip_against_the_files(engine, tmp_path):
    store = SwapStore(engine, str(tmp_path), rank=2, name="params", files=3)
    assert store.directory == f"{tmp_path}/zerostream/rank2/params"
    files = ["swap_00.bin", "swap_01.bin", "swap_02.bin"]
    assert sorted(os.listdir(store.directory)) == [".lock", *files]  # .lock: dir_lock.h
    tensors = {i: torch.randn(1000 + 333 * i, dtype=torch.float32) for i in range(12)}
    tickets = [store.write(i, t) for i, t in tensors.items()]
    for tk in tickets:
        tk.wait()
    for i, t in tensors.items():
        path, offset, reserved = store.extent_of(i)
        # Extents are sized by the tensor, rounded to 4 KiB (O_DIRECT), not the block size.
        assert offset % 4096 == 0 and reserved == (t.numel() * 4 + 4095) // 4096 * 4096
        with open(path, "rb") as f:  # independent reference: the bytes on disk
            f.seek(offset)
            assert f.read(t.numel() * 4) == t.numpy().tobytes()
        back = torch.empty_like(t)
        store.read(i, back).wait()
        assert torch.equal(back, t)
    assert store.stats()["tensors"] == 12


def test_checksums_catch_corruption(engine, tmp_path):
    store = SwapStore(engine, str(tmp_path), verify_checksums=True)
    t = torch.arange(50000, dtype=torch.int64)
    store.write(5, t).wait()
    path, offset, _ = store.extent_of(5)
    with open(path, "r+b") as f:
        f.seek(offset + 1234)
        f.write(b"\xff")
    with pytest.raises(IoError, match="checksum mismatch for tensor 5"):
        store.read(5, torch.empty_like(t)).wait()


def test_environment_variable_fault_injection(tmp_path):
    code = (
        "import torch, sys\n"
        "from zerostream.offload.io_engine import IoEngine\n"
        "e = IoEngine(block_size=65536, queue_depth=1)\n"
        "t = torch.zeros(1 << 20, dtype=torch.uint8)\n"
        f"tk = e.write(t, {str(tmp_path / 'env.bin')!r})\n"
        "try:\n"
        "    tk.wait()\n"
        "except OSError as err:\n"
        "    print('ERR', err.errno, err)\n"
    )
    env = dict(os.environ, ZS_IO_FAULT="3:EIO")
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ERR 5 ") and "env.bin at offset 131072" in r.stdout, r.stdout


def _aio(**section):
    return load({"train_batch_size": 1, "aio": section}, world_size=1, log=False).aio


def test_ds_config_aio_section_maps_onto_the_engine_config():
    c = io_config_for(
        _aio(
            block_size=262144,
            queue_depth=16,
            thread_count=2,
            single_submit=True,
            overlap_events=False,
            backend="threads",
        )
    )
    assert (
        c.block_size,
        c.queue_depth,
        c.threads,
        c.single_submit,
        c.overlap_events,
        c.backend,
    ) == (262144, 16, 2, True, False, "threads")
    d = io_config_for(_aio())  # DeepSpeed's defaults, from the schema
    assert (d.block_size, d.queue_depth, d.threads, d.overlap_events, d.backend) == (
        1048576,
        8,
        1,
        True,
        "auto",
    )
    typo = load({"train_batch_size": 1, "aio": {"queue_dpeth": 8}}, world_size=1, log=False)
    assert any(w.startswith("aio.queue_dpeth: unknown key") for w in typo.warnings)
    with pytest.raises(ValueError, match="aio.backend"):
        _aio(backend="libaio")
    with pytest.raises(NotImplementedError, match="aio.use_gds"):
        io_config_for(_aio(use_gds=True))


def test_io_config_starts_from_the_engine_defaults_and_rejects_unknown_fields():
    native = _C.offload.IoConfig()
    c = io_config(queue_depth=4)
    assert (c.block_size, c.queue_depth, c.threads) == (native.block_size, 4, native.threads)
    with pytest.raises(TypeError, match="intra_op_parallelism"):
        io_config(intra_op_parallelism=2)
