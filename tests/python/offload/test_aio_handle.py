"""DeepSpeed's aio handle API over zerostream: round trips of torch tensors, batches,
return values, errors. References are plain Python file reads and writes."""

from __future__ import annotations

import errno
import os

import pytest
import torch

from zerostream.offload.fault_injection import io_faults_injected, set_io_fault
from zerostream.offload.io_engine import IoError
from zerostream.ops.aio import AsyncIOBuilder

DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.uint8,
    torch.bool,
]


def _random(numel: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(
        0,
        256,
        (numel * torch.empty((), dtype=dtype).element_size(),),
        dtype=torch.uint8,
        generator=g,
    )
    if dtype == torch.bool:
        return (raw % 2).to(torch.bool)
    return raw.view(dtype)


def _file_bytes(path, offset, n) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(n)


def _tensor_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (random bit patterns include NaNs, which torch.equal rejects)."""
    return a.dtype == b.dtype and a.shape == b.shape and _tensor_bytes(a) == _tensor_bytes(b)


@pytest.fixture(params=["io_uring", "threads"])
def handle(request):
    return (
        AsyncIOBuilder()
        .load()
        .aio_handle(
            block_size=65536,
            queue_depth=8,
            single_submit=False,
            overlap_events=True,
            intra_op_parallelism=2,
            backend=request.param,
        )
    )


def test_builder_and_getters_match_deepspeed_defaults():
    b = AsyncIOBuilder()
    assert b.is_compatible()
    h = b.load().aio_handle()
    assert (
        h.get_block_size(),
        h.get_queue_depth(),
        h.get_single_submit(),
        h.get_overlap_events(),
        h.get_intra_op_parallelism(),
    ) == (1048576, 128, False, False, 1)
    assert h.get_thread_count() == 1
    h2 = b.load().aio_handle(262144, 16, True, True, 3)
    assert (
        h2.get_block_size(),
        h2.get_queue_depth(),
        h2.get_single_submit(),
        h2.get_overlap_events(),
        h2.get_intra_op_parallelism(),
    ) == (262144, 16, True, True, 3)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trips_dtypes_at_odd_sizes_and_offsets(handle, tmp_path, dtype):
    for i, (numel, offset) in enumerate([(1, 0), (1000, 4096), (77777, 13), (300001, 65536)]):
        src = _random(numel, dtype, seed=i)
        path = str(tmp_path / f"t{i}.bin")
        assert handle.sync_pwrite(src, path, offset) == 1
        assert _file_bytes(path, offset, len(_tensor_bytes(src))) == _tensor_bytes(src)
        dst = torch.zeros(numel, dtype=dtype)
        assert handle.sync_pread(dst, path, offset) == 1
        assert _same(dst, src)


def test_async_batch_and_wait_counts(handle, tmp_path):
    srcs = [_random(50000 + 17 * i, torch.float32, seed=i) for i in range(6)]
    paths = [str(tmp_path / f"b{i}.bin") for i in range(6)]
    for s, p in zip(srcs, paths):
        assert handle.async_pwrite(s, p) == 0
    assert handle.wait() == 6
    assert handle.wait() == 0
    dsts = [torch.empty_like(s) for s in srcs]
    for d, p in zip(dsts, paths):
        assert handle.async_pread(d, p) == 0
    assert handle.wait() == 6
    for s, d in zip(srcs, dsts):
        assert _same(s, d)


def test_pread_pwrite_with_deepspeed_positional_and_async_keyword(handle, tmp_path):
    src = _random(4099, torch.float16, seed=3)
    path = str(tmp_path / "p.bin")
    assert handle.pwrite(src, path, True, False, 0) == 1  # validate, sync
    dst = torch.empty_like(src)
    assert handle.pread(dst, path, False, **{"async": True}) == 0
    assert handle.wait() == 1
    assert _same(src, dst)
    assert handle.read(dst, path) == 0 and handle.write(src, path) == 0


def test_locked_tensors_are_aligned_typed_and_usable_for_io(handle, tmp_path):
    t = handle.new_cpu_locked_tensor(12345, torch.empty(0, dtype=torch.bfloat16))
    assert t.dtype == torch.bfloat16 and t.numel() == 12345
    assert t.data_ptr() % 4096 == 0
    assert handle.is_pinned(t)
    t.copy_(_random(12345, torch.bfloat16, seed=4))
    path = str(tmp_path / "l.bin")
    handle.sync_pwrite(t, path)
    assert _file_bytes(path, 0, 12345 * 2) == _tensor_bytes(t)
    assert handle.pinned_stats()["in_use"] >= 12345 * 2
    assert handle.free_cpu_locked_tensor(t)
    assert not handle.free_cpu_locked_tensor(torch.empty(3))
    del t
    assert handle.pinned_stats()["in_use"] == 0


def test_read_past_end_of_file_is_a_value_error_naming_the_file(handle, tmp_path):
    path = str(tmp_path / "short.bin")
    with open(path, "wb") as f:
        f.write(b"x" * 1000)
    with pytest.raises(ValueError, match=r"short\.bin.*past the end of the file \(1000 bytes\)"):
        handle.sync_pread(torch.empty(1001, dtype=torch.uint8), path)
    with pytest.raises(OSError) as e:
        handle.sync_pread(torch.empty(1, dtype=torch.uint8), str(tmp_path / "missing.bin"))
    assert e.value.errno == errno.ENOENT and "missing.bin" in str(e.value)


@pytest.mark.parametrize("spec,err", [("2:EIO", errno.EIO), ("1:ENOSPC", errno.ENOSPC)])
def test_injected_errors_surface_from_wait_with_path_and_errno(tmp_path, spec, err):
    h = AsyncIOBuilder().load().aio_handle(65536, 1, False, True, 1)
    src = _random(300000, torch.uint8, seed=5)
    path = str(tmp_path / "f.bin")
    set_io_fault(spec)
    try:
        h.async_pwrite(src, path)
        h.async_pwrite(src, str(tmp_path / "g.bin"))
        with pytest.raises(IoError) as e:
            h.wait()
    finally:
        set_io_fault(None)
    assert e.value.errno == err
    assert "f.bin" in str(e.value) and os.strerror(err) in str(e.value)
    assert "offset" in str(e.value)
    assert h.wait() == 0  # both requests were drained before raising


def test_short_completions_are_finished(tmp_path):
    h = AsyncIOBuilder().load().aio_handle(65536, 1, False, True, 1)
    src = _random(500000, torch.float32, seed=6)
    path = str(tmp_path / "s.bin")
    set_io_fault("1:short:every")
    try:
        h.sync_pwrite(src, path)
        dst = torch.empty_like(src)
        h.sync_pread(dst, path)
        injected = io_faults_injected()
    finally:
        set_io_fault(None)
    assert injected > 10
    assert _same(dst, src)
    assert _file_bytes(path, 0, src.numel() * 4) == _tensor_bytes(src)


def test_rejects_bad_config_and_buffers():
    with pytest.raises(ValueError, match="aio.block_size"):
        AsyncIOBuilder().load().aio_handle(block_size=1000)
    with pytest.raises(ValueError, match="aio.backend"):
        AsyncIOBuilder().load().aio_handle(backend="libaio")
    h = AsyncIOBuilder().load().aio_handle()
    with pytest.raises(ValueError, match="contiguous"):
        h.sync_pwrite(torch.zeros(10, 10).t(), "/tmp/never_written.bin")


def test_a_file_given_by_an_open_descriptor_is_written_and_read(tmp_path):
    """DeepSpeed's async_pwrite/async_pread(fd=...): the bytes land in the file the descriptor
    names, at the offset asked; with a 1 KiB block size (DeepSpeed's own tests')."""
    h = AsyncIOBuilder().load().aio_handle(1024, 2, True, True, 2)
    path = tmp_path / "by_fd.bin"
    src = _random(3 * 4096 + 100, torch.uint8, 5)
    fd = os.open(path, os.O_CREAT | os.O_WRONLY)
    try:
        assert h.async_pwrite(buffer=src, fd=fd, file_offset=4096) == 0
        assert h.wait() == 1
    finally:
        os.close(fd)
    with open(path, "rb") as f:
        f.seek(4096)
        assert f.read() == src.numpy().tobytes()
    dst = torch.zeros_like(src)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert h.async_pread(dst, fd=fd, file_offset=4096) == 0
        assert h.wait() == 1
    finally:
        os.close(fd)
    assert torch.equal(dst, src)
    with pytest.raises(ValueError, match="give filename or fd"):
        h.async_pwrite(src, str(path), fd=3)
    with pytest.raises(ValueError, match="fd 987654 is not an open file"):
        h.async_pwrite(src, fd=987654)


def test_the_accelerator_makes_deepspeeds_typed_tensors():
    from zerostream.accelerator import get_accelerator

    t = get_accelerator().ByteTensor([1, 2, 255])
    assert t.dtype == torch.uint8 and t.tolist() == [1, 2, 255]
    assert get_accelerator().LongTensor([3]).dtype == torch.int64
    assert get_accelerator().BFloat16Tensor([1.5]).dtype == torch.bfloat16
