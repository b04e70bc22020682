"""DeepSpeed's FastFileWriter (deepspeed.io) over zerostream's aio handle: what reaches the
disk is byte for byte what torch.save writes to a plain file, for staging buffers of any
size (single and double buffered, 4 KiB aligned or not), no descriptor stays open on the
file, disk errors surface naming the file, and bad arguments are named."""

from __future__ import annotations

import errno
import io
import os

import pytest
import torch

from zerostream.checkpoint.fast_file_writer import FastFileWriter, FastFileWriterConfig
from zerostream.offload.fault_injection import set_io_fault
from zerostream.offload.locked_tensors import locked_tensors
from zerostream.ops.aio import AsyncIOBuilder


def _handle():
    return AsyncIOBuilder().load().aio_handle(1 << 16, 8, False, False, 1)


def _writer(path, staging_bytes: int, double_buffer: bool = True) -> FastFileWriter:
    staging = locked_tensors().new(staging_bytes, torch.uint8)
    cfg = FastFileWriterConfig(_handle(), staging, double_buffer=double_buffer)
    return FastFileWriter(str(path), cfg)


def _state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(300, 211, generator=g),
        "b": torch.randn(7, generator=g).to(torch.bfloat16),
        "step": 12,
        "nested": [torch.arange(5), {"m": torch.ones(3, 3, dtype=torch.float16)}],
    }


@pytest.mark.parametrize("staging_bytes", [4096, 8192, 12345, 1 << 20])
@pytest.mark.parametrize("double_buffer", [True, False])
def test_torch_save_through_the_writer_equals_plain_torch_save(
    tmp_path, staging_bytes, double_buffer
):
    state = _state(staging_bytes)
    reference = io.BytesIO()
    torch.save(state, reference)
    path = tmp_path / "ckpt.pt"
    with open(path, "wb") as f:
        f.write(b"old contents longer than nothing" * 100000)  # must be replaced, not kept
    w = _writer(path, staging_bytes, double_buffer)
    torch.save(state, w)
    w.close()
    assert path.read_bytes() == reference.getvalue()
    loaded = torch.load(path, weights_only=True)
    assert torch.equal(loaded["w"], state["w"]) and loaded["step"] == 12
    stats = w.stats  # DeepSpeed's keys: every byte torch wrote went through the handle
    assert stats["bytes"] == stats["aio_bytes"] == len(reference.getvalue())
    assert stats["slow_bytes"] == 0 and stats["close"] == 1


def test_raw_writes_of_any_length_land_in_order(tmp_path):
    g = torch.Generator().manual_seed(3)
    chunks = [
        bytes(torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).tolist())
        for n in (0, 1, 4095, 4096, 4097, 10000, 3)
    ]
    path = tmp_path / "raw.bin"
    with _writer(path, 8192) as w:
        for c in chunks:
            assert w.write(c) == len(c)
        assert w.tell() == sum(map(len, chunks))
    assert path.read_bytes() == b"".join(chunks)
    with pytest.raises(ValueError, match="raw.bin is closed"):
        w.write(b"x")


def _fds_on(path) -> int:
    target = os.path.realpath(path)
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        n += link.startswith(target)
    return n


def test_close_leaves_no_descriptor_on_the_file(tmp_path):
    for i in range(5):
        path = tmp_path / f"rot_{i}.pt"
        w = _writer(path, 8192)
        torch.save(torch.zeros(100000, dtype=torch.uint8), w)
        w.close()
        assert _fds_on(path) == 0
        os.unlink(path)
        assert _fds_on(path) == 0  # no "(deleted)" descriptor pinning the blocks


def test_a_disk_error_is_raised_at_close_naming_the_file(tmp_path):
    path = tmp_path / "fails.pt"
    w = _writer(path, 1 << 20)
    w.write(b"z" * 5000)
    set_io_fault("1:EIO")
    try:
        with pytest.raises(OSError) as e:
            w.close()
    finally:
        set_io_fault(None)
    assert e.value.errno == errno.EIO and "fails.pt" in str(e.value)


def test_bad_arguments_are_named(tmp_path):
    with pytest.raises(ValueError, match="pinned_tensor: expected a contiguous CPU uint8"):
        FastFileWriter(str(tmp_path / "a"), FastFileWriterConfig(_handle(), torch.zeros(64)))
    with pytest.raises(ValueError, match="pinned_tensor: expected a torch.Tensor"):
        FastFileWriter(str(tmp_path / "a"), FastFileWriterConfig(_handle(), None))  # type: ignore[arg-type]
    staging = torch.zeros(4096, dtype=torch.uint8)
    with pytest.raises(ValueError, match="dnvme_handle: expected an aio handle"):
        FastFileWriter(str(tmp_path / "a"), FastFileWriterConfig(object(), staging))
