"""Real filesystems that misbehave (TESTING.md): a full ext4 image and a filesystem that
refuses O_DIRECT. No mocks: the kernel produces the errors."""

from __future__ import annotations

import errno
import os

import pytest
import torch

from zerostream.offload.io_engine import IoEngine, IoError, warnings_emitted
from zerostream.offload.swap_store import SwapStore
from zerostream.ops.aio import AsyncIOBuilder


def _pattern(i: int, nbytes: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + i)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)


def test_swap_store_out_of_space_is_clear_and_keeps_earlier_tensors(full_disk):
    engine = IoEngine(block_size=1 << 20, queue_depth=8)
    store = SwapStore(
        engine,
        full_disk,
        rank=0,
        name="optimizer",
        files=2,
        grow_bytes=4 << 20,
        verify_checksums=True,
    )
    written = {}
    with pytest.raises(IoError) as e:
        for i in range(100):  # 100 x 1 MiB never fits in 16 MiB
            t = _pattern(i, (1 << 20) - 100 * i)
            store.write(i, t).wait()
            written[i] = t
    err = e.value
    assert err.errno == errno.ENOSPC
    msg = str(err)
    assert "out of space" in msg and f"tensor {len(written)} needs" in msg
    assert store.directory in msg and "swap_0" in msg
    assert "bytes free" in msg
    assert len(written) >= 5
    failed_id = len(written)
    assert failed_id not in store  # no half-allocated entry is left behind
    # Everything stored before the failure reads back intact (and passes its CRC32C).
    for i, t in written.items():
        back = torch.empty_like(t)
        store.read(i, back).wait()
        assert torch.equal(back, t), f"tensor {i} damaged"
    # Freeing space makes room again, in the same files.
    store.free(0)
    store.free(1)
    t = _pattern(99, 1 << 20)
    store.write(99, t).wait()
    back = torch.empty_like(t)
    store.read(99, back).wait()
    assert torch.equal(back, t)


def test_aio_write_to_a_full_disk_raises_enospc_with_the_path(full_disk):
    h = AsyncIOBuilder().load().aio_handle(1 << 20, 8, False, True, 1)
    keep = {}
    with pytest.raises(OSError) as e:
        for i in range(40):
            t = _pattern(i, 1 << 20)
            path = os.path.join(full_disk, f"t{i}.bin")
            h.sync_pwrite(t, path)
            keep[path] = t
    assert e.value.errno == errno.ENOSPC
    assert full_disk in str(e.value) and "offset" in str(e.value)
    assert len(keep) >= 5
    for path, t in keep.items():
        back = torch.empty_like(t)
        h.sync_pread(back, path)
        assert torch.equal(back, t)


@pytest.mark.parametrize("backend", ["io_uring", "threads"])
def test_tmpfs_path_round_trips(tmpfs_dir, backend):
    engine = IoEngine(block_size=1 << 16, queue_depth=8, backend=backend)
    t = _pattern(1, (3 << 20) + 5)
    path = os.path.join(tmpfs_dir, "x.bin")
    engine.write(t, path, 4096).wait()
    back = torch.empty_like(t)
    engine.read(back, path, 4096).wait()
    assert torch.equal(back, t)


@pytest.mark.parametrize("backend", ["io_uring", "threads"])
def test_filesystem_refusing_o_direct_gets_a_warning_and_buffered_io(no_direct_dir, backend):
    engine = IoEngine(block_size=1 << 16, queue_depth=8, backend=backend)
    t = _pattern(2, (2 << 20) + 7)
    path = os.path.join(no_direct_dir, "y.bin")
    engine.write(t, path).wait()
    back = torch.empty_like(t)
    engine.read(back, path).wait()
    assert torch.equal(back, t)
    warnings = [w for w in warnings_emitted() if "refuses O_DIRECT" in w]
    assert any(no_direct_dir in w for w in warnings), warnings
    assert "buffered" in warnings[-1]
