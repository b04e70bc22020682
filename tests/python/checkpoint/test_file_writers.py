"""DeepSpeed's file writers (deepspeed.io) on zerostream: PyFileWriter and FastFileWriter hold
exactly the bytes torch.save writes (to a path in torch's legacy format; to a file object in
the zip format, whose archive name torch takes from a path's basename), MockFileWriter counts
what a real save writes and writes nothing, the storage-list path writes each storage's
element count and bytes (a share of them per parallel writer), and the double IO buffer never
has two writes in flight."""

from __future__ import annotations

import io
import os
import struct

import pytest
import torch

from zerostream.checkpoint.fast_file_writer import FastFileWriter, FastFileWriterConfig
from zerostream.checkpoint.file_writer import INVALID_FD, MockFileWriter, PyFileWriter
from zerostream.checkpoint.io_buffer import DoubleIOBuffer, SingleIOBuffer
from zerostream.offload.locked_tensors import locked_tensors
from zerostream.ops.aio import AsyncIOBuilder


def _handle():
    return AsyncIOBuilder().load().aio_handle(1 << 16, 8, False, False, 1)


def _fast(path, staging=8192, double=True, writers=1, rank=0) -> FastFileWriter:
    cfg = FastFileWriterConfig(
        _handle(),
        locked_tensors().new(staging, torch.uint8),
        double_buffer=double,
        num_parallel_writers=writers,
        writer_rank=rank,
    )
    return FastFileWriter(str(path), cfg)


def _state() -> dict:
    g = torch.Generator().manual_seed(5)
    w = torch.randn(64, 33, generator=g)
    return {
        "w": w,
        "w_t": w.t(),  # shares w's storage
        "h": torch.randn(100, generator=g).half(),
        "i": torch.arange(7),
        "meta": {"step": 3, "name": "x"},
    }


class _CountingSink(io.RawIOBase):
    """A reference file object: counts torch.save's write calls and bytes."""

    def __init__(self):
        self.calls = 0
        self.nbytes = 0

    def writable(self):
        return True

    def write(self, b):
        self.calls += 1
        self.nbytes += memoryview(b).nbytes
        return memoryview(b).nbytes


def _writers(tmp_path):
    yield "python", PyFileWriter(tmp_path / "py.pt")
    yield "fast-double", _fast(tmp_path / "fd.pt", 8192, True)
    yield "fast-single", _fast(tmp_path / "fs.pt", 5000, False)


@pytest.mark.parametrize("zipfile", [True, False])
def test_writers_hold_the_bytes_torch_save_writes(tmp_path, zipfile):
    state = _state()
    reference = io.BytesIO()
    torch.save(state, reference, _use_new_zipfile_serialization=zipfile)
    to_path = tmp_path / "plain.pt"
    torch.save(state, to_path, _use_new_zipfile_serialization=zipfile)
    for name, w in _writers(tmp_path):
        torch.save(state, w, _use_new_zipfile_serialization=zipfile)
        w.close()
        data = open(w.file_path(), "rb").read()
        assert data == reference.getvalue(), name
        if not zipfile:  # no archive name in the legacy format: equal to the path's file
            assert data == to_path.read_bytes(), name
        assert w.stats["bytes"] == len(data) and w.stats["close"] == 1, name
        loaded = torch.load(w.file_path(), weights_only=False)
        assert torch.equal(loaded["w"], state["w"]) and loaded["meta"] == state["meta"]
        assert (
            loaded["w_t"].untyped_storage().data_ptr() == loaded["w"].untyped_storage().data_ptr()
        )


def test_fileno_sends_legacy_storages_through_write(tmp_path):
    """torch's legacy serializer writes storages straight to a descriptor a file object
    gives it; INVALID_FD keeps them in the writer (so the count is the file's size)."""
    w = PyFileWriter(tmp_path / "legacy.pt")
    assert w.fileno() == INVALID_FD
    torch.save(_state(), w, _use_new_zipfile_serialization=False)
    w.close()
    assert w.stats["bytes"] == os.path.getsize(tmp_path / "legacy.pt")
    assert w.stats["fileno"] >= 2 and w.stats["write_secs"] > 0


@pytest.mark.parametrize("zipfile", [True, False])
def test_mock_counts_what_a_save_writes_and_writes_nothing(tmp_path, zipfile):
    state = _state()
    sink = _CountingSink()
    torch.save(state, sink, _use_new_zipfile_serialization=zipfile)
    m = MockFileWriter(tmp_path / "mock.pt")
    torch.save(state, m, _use_new_zipfile_serialization=zipfile)
    m.close()
    assert m.stats["bytes"] == sink.nbytes and m.stats["write"] == sink.calls
    assert os.path.getsize(tmp_path / "mock.pt") == 0  # created, as DeepSpeed's mock does
    with pytest.raises(ValueError, match="mock.pt is closed"):
        m.write(b"x")


def _storages():
    g = torch.Generator().manual_seed(9)
    tensors = [torch.randn(1000, generator=g), torch.arange(13, dtype=torch.int16),
               torch.randn(3, 5, generator=g).to(torch.bfloat16), torch.empty(0)]  # fmt: skip
    return tensors, [(t.untyped_storage(), t.dtype) for t in tensors]


def _expected_stream(tensors, save_size: bool) -> bytes:
    """By hand: each storage's element count (int64, little-endian) and its bytes."""
    out = b""
    for t in tensors:
        if save_size:
            out += struct.pack("<q", t.numel())
        out += t.contiguous().view(torch.uint8).numpy().tobytes()
    return out


@pytest.mark.parametrize("save_size", [True, False])
def test_storage_list_bytes_mock_counts_and_parallel_shares(tmp_path, save_size):
    tensors, objs = _storages()
    expected = _expected_stream(tensors, save_size)
    w = _fast(tmp_path / "one.bin", 4096)
    assert w.save_torch_storage_object_list(objs, save_size) == len(expected)
    w.close()
    assert (tmp_path / "one.bin").read_bytes() == expected
    assert w.stats["save_storage"] == len(objs)

    m = MockFileWriter(tmp_path / "mock.bin")
    assert m.save_torch_storage_object_list(objs, save_size) == len(expected)
    assert m.stats["bytes"] == len(expected)
    assert m.stats["save_storage_bytes"] == sum(t.nbytes for t in tensors)

    for writers in (2, 3, 7):
        parts = []
        for rank in range(writers):
            p = tmp_path / f"part{writers}_{rank}.bin"
            pw = _fast(p, 4096, writers=writers, rank=rank)
            pw.save_torch_storage_object_list(objs, save_size)
            pw.close()
            parts.append(p.read_bytes())
        assert b"".join(parts) == expected
        share, extra = divmod(len(expected), writers)
        assert [len(p) for p in parts] == [share + (r < extra) for r in range(writers)]


def test_parallel_writer_rank_is_checked(tmp_path):
    with pytest.raises(ValueError, match="writer_rank=3"):
        _fast(tmp_path / "x", writers=3, rank=3)


class _Watched:
    """The real handle, with the writes in flight counted (not a stand-in: every call goes
    through)."""

    def __init__(self, handle):
        self.h, self.in_flight, self.most, self.sources = handle, 0, 0, []

    def get_alignment(self):
        return self.h.get_alignment()

    def async_pwrite(self, buf, filename, file_offset):
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        self.sources.append(buf.data_ptr())
        return self.h.async_pwrite(buf, filename, file_offset)

    def wait(self):
        done = self.h.wait()
        self.in_flight -= done
        return done


@pytest.mark.parametrize("kind", [SingleIOBuffer, DoubleIOBuffer])
def test_io_buffers_write_in_order_one_write_in_flight(tmp_path, kind):
    path = str(tmp_path / "buf.bin")
    open(path, "wb").close()
    watched = _Watched(_handle())
    staging = locked_tensors().new(8192, torch.uint8)
    buf = kind(staging, watched)
    src = torch.randint(
        0, 256, (50000,), dtype=torch.uint8, generator=torch.Generator().manual_seed(1)
    )
    done = written = 0
    while done < src.numel():
        done += buf.fill(src, done)
        if buf.is_full():
            n = buf.get_offset()
            assert buf.get_unaligned_num_bytes() == n % 4096
            buf.drain(n, path, written)
            written += n
    assert buf.get_aligned_num_bytes() == buf.get_offset() // 4096 * 4096
    buf.drain(buf.get_offset(), path, written)
    buf.complete_ongoing_drain()
    assert buf.is_empty() and watched.in_flight == 0
    assert open(path, "rb").read() == src.numpy().tobytes()
    assert watched.most == 1
    if kind is DoubleIOBuffer:  # the halves alternate: the next fills while one is written
        halves = {staging.data_ptr(), staging.data_ptr() + 4096}
        assert set(watched.sources) == halves
        assert all(a != b for a, b in zip(watched.sources, watched.sources[1:]))
