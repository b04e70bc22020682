"""DeepSpeed's fast checkpoint writer (`deepspeed.io.FastFileWriter`): a file object that
`torch.save` writes into, which stages the bytes in a caller's page-locked tensor and writes
them to disk through an aio handle, one half of the tensor filling while the other is
written (`double_buffer`; io_buffer.py).

    handle = AsyncIOBuilder().load().aio_handle(block_size=1 << 20, queue_depth=8)
    cfg = FastFileWriterConfig(dnvme_handle=handle, pinned_tensor=locked_uint8_tensor)
    with FastFileWriter(path, cfg) as f:
        torch.save(state, f)

The handle's engine writes with O_DIRECT where the file system and the alignment allow and
through a buffered descriptor where not (the tail of the file, any unaligned piece), so the
file holds exactly the bytes written, and is created or emptied first. Every write is
checked: an I/O error is raised at the next `write`, `flush` or `close`, naming the file.
`close()` fsyncs and leaves no descriptor open on the file (the engine opens its own per
request). Statistics under DeepSpeed's keys (file_writer.py); all bytes go through the
handle, so `aio_bytes` is the file's size and `slow_bytes` stays 0.
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from .file_writer import (
    AIO_FILL_BUFFER_COUNT_KEY,
    AIO_FILL_BUFFER_SEC_KEY,
    AIO_FILL_BUFFER_SPEED_KEY,
    AIO_SPEED_KEY,
    AIO_WRITE_BYTES_KEY,
    AIO_WRITE_SEC_KEY,
    CLOSE_COUNT_KEY,
    FILENO_COUNT_KEY,
    FLUSH_COUNT_KEY,
    GIB,
    INVALID_FD,
    SAVE_STORAGE_BYTES_KEY,
    SAVE_STORAGE_KEY,
    SLOW_WRITE_BYTES_KEY,
    SLOW_WRITE_SEC_KEY,
    WRITE_BYTES_KEY,
    WRITE_COUNT_KEY,
    WRITE_SEC_KEY,
    BaseFileWriter,
)
from .io_buffer import DoubleIOBuffer, IOBuffer, SingleIOBuffer
from .storage_bytes import storage_byte_tensors, writer_slice

FASTIO_STAT_KEYS = [
    AIO_WRITE_SEC_KEY,
    AIO_WRITE_BYTES_KEY,
    AIO_SPEED_KEY,
    SLOW_WRITE_BYTES_KEY,
    SLOW_WRITE_SEC_KEY,
    AIO_FILL_BUFFER_COUNT_KEY,
    AIO_FILL_BUFFER_SEC_KEY,
    AIO_FILL_BUFFER_SPEED_KEY,
    SAVE_STORAGE_KEY,
    SAVE_STORAGE_BYTES_KEY,
]


@dataclass
class FastFileWriterConfig:
    """DeepSpeed's fields. `dnvme_handle`: an aio handle (`aio_handle`); `pinned_tensor`: a
    contiguous CPU uint8 tensor, page-locked for speed (the staging buffer). With
    `num_parallel_writers` > 1, `save_torch_storage_object_list` writes this writer's
    (`writer_rank`) share of the storages' bytes; `write` always writes what it is given."""

    dnvme_handle: Any
    pinned_tensor: torch.Tensor
    double_buffer: bool = True
    num_parallel_writers: int = 1
    writer_rank: int = 0
    global_rank: int = 0


class FastFileWriter(BaseFileWriter):
    """A write-only binary file object over an aio handle and a staging tensor."""

    def __init__(self, file_path, config: FastFileWriterConfig):
        super().__init__(file_path)
        kind = DoubleIOBuffer if config.double_buffer else SingleIOBuffer
        self._io_buffer: IOBuffer = kind(config.pinned_tensor, config.dnvme_handle)
        writer_slice(0, config.num_parallel_writers, config.writer_rank)  # checks the pair
        self._num_parallel_writers = config.num_parallel_writers
        self._writer_rank = config.writer_rank
        self._global_rank = config.global_rank
        self._file_offset = 0  # where the bytes being staged go in the file
        self._closed = False
        with open(self._file_path, "wb"):
            pass  # created, or emptied: the writes below start at offset 0
        for k in FASTIO_STAT_KEYS:
            self._stats[k] = 0

    # --- the file object torch.save writes to --------------------------------------
    def write(self, buffer) -> int:
        self._check_open("write")
        view = memoryview(buffer).cast("B")
        if not len(view):
            self._update_write_stats(0, 0.0)
            return 0
        with warnings.catch_warnings():  # read-only bytes: src is only ever read
            warnings.filterwarnings("ignore", "The given buffer is not writable")
            src = torch.frombuffer(view, dtype=torch.uint8)
        return self._write_from_tensor(src)

    def save_torch_storage_object_list(self, storage_obj_list, save_size: bool) -> int:
        """Writes the storages' bytes (each preceded by its 8-byte element count when
        `save_size`), or this writer's share of them when there are several writers;
        returns the bytes written."""
        self._check_open("save_torch_storage_object_list")
        pieces = [t.cpu() for t in storage_byte_tensors(storage_obj_list, save_size)]
        if self._num_parallel_writers > 1:
            pieces = _slice_of(pieces, self._num_parallel_writers, self._writer_rank)
        written = sum(self._write_from_tensor(p) for p in pieces if p.numel())
        self._incr_stats(SAVE_STORAGE_KEY, len(storage_obj_list))
        self._incr_stats(SAVE_STORAGE_BYTES_KEY, written)
        return written

    def flush(self) -> None:
        """Nothing is held back from the file system beyond the staging buffer; `close`
        writes it (torch.save calls flush before it is done)."""
        self._check_open("flush")
        self._incr_stats(FLUSH_COUNT_KEY)

    def fileno(self) -> int:
        self._incr_stats(FILENO_COUNT_KEY)
        return INVALID_FD

    def tell(self) -> int:
        return self._file_offset + self._io_buffer.get_offset()

    def close(self) -> None:
        """Writes what is staged, waits for every write, fsyncs the file."""
        if self._closed:
            return
        self._closed = True
        self._incr_stats(CLOSE_COUNT_KEY)
        start = time.perf_counter()
        try:
            if self._io_buffer.get_offset():
                self._drain_io_buffer()
            self._io_buffer.complete_ongoing_drain()
        finally:
            self._io_buffer.reset()
            fd = os.open(self._file_path, os.O_WRONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            self._incr_stats(WRITE_SEC_KEY, time.perf_counter() - start)

    @property
    def closed(self) -> bool:
        return self._closed

    def __del__(self):
        if not getattr(self, "_closed", True):
            try:
                self.close()
            except Exception:  # noqa: BLE001 - nobody is left to report to
                pass

    # --- internals -----------------------------------------------------------------
    def _write_from_tensor(self, src: torch.Tensor) -> int:
        start = time.perf_counter()
        done = 0
        while done < src.numel():
            t0 = time.perf_counter()
            done += self._io_buffer.fill(src, done)
            self._incr_stats(AIO_FILL_BUFFER_SEC_KEY, time.perf_counter() - t0)
            self._incr_stats(AIO_FILL_BUFFER_COUNT_KEY)
            if self._io_buffer.is_full():
                self._drain_io_buffer()
        self._update_write_stats(done, time.perf_counter() - start)
        return done

    def _drain_io_buffer(self) -> None:
        """Issues the staged bytes' write (with two halves, the next half fills meanwhile)."""
        n = self._io_buffer.get_offset()
        start = time.perf_counter()
        self._io_buffer.drain(n, self._file_path, self._file_offset)
        self._incr_stats(AIO_WRITE_SEC_KEY, time.perf_counter() - start)
        self._incr_stats(AIO_WRITE_BYTES_KEY, n)
        self._file_offset += n

    def _update_write_stats(self, num_bytes: int, secs: float) -> None:
        self._incr_stats(WRITE_COUNT_KEY)
        self._incr_stats(WRITE_BYTES_KEY, num_bytes)
        self._incr_stats(WRITE_SEC_KEY, secs)

    def _speeds(self) -> None:
        super()._speeds()
        s = self._stats
        if s[AIO_WRITE_SEC_KEY] > 0:
            s[AIO_SPEED_KEY] = s[AIO_WRITE_BYTES_KEY] / (s[AIO_WRITE_SEC_KEY] * GIB)
        if s[AIO_FILL_BUFFER_SEC_KEY] > 0:
            s[AIO_FILL_BUFFER_SPEED_KEY] = s[AIO_WRITE_BYTES_KEY] / (
                s[AIO_FILL_BUFFER_SEC_KEY] * GIB
            )

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise ValueError(f"FastFileWriter.{what}: {self._file_path} is closed")


def _slice_of(pieces: list, writers: int, rank: int) -> list:
    """The views of `pieces` (uint8 tensors, taken as one byte stream) that fall in writer
    `rank`'s share (storage_bytes.writer_slice)."""
    start, end = writer_slice(sum(p.numel() for p in pieces), writers, rank)
    out, at = [], 0
    for p in pieces:
        lo, hi = max(start, at), min(end, at + p.numel())
        if lo < hi:
            out.append(p.narrow(0, lo - at, hi - lo))
        at += p.numel()
    return out


__all__ = ["FASTIO_STAT_KEYS", "FastFileWriter", "FastFileWriterConfig"]
