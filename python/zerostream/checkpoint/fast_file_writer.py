"""DeepSpeed's fast checkpoint writer (`deepspeed.io.FastFileWriter`): a file object that
`torch.save` writes into, which stages the bytes in a caller's page-locked tensor and writes
them to disk through an aio handle, one half of the tensor filling while the other is
written (`double_buffer`).

    handle = AsyncIOBuilder().load().aio_handle(block_size=1 << 20, queue_depth=8)
    cfg = FastFileWriterConfig(dnvme_handle=handle, pinned_tensor=locked_uint8_tensor)
    with FastFileWriter(path, cfg) as f:
        torch.save(state, f)

The handle's engine writes with O_DIRECT where the file system and the alignment allow and
through a buffered descriptor where not (the tail of the file, any unaligned piece), so the
file holds exactly the bytes written. Every write is checked: an I/O error is raised at the
next `write`, `flush` or `close`, naming the file. `close()` leaves no descriptor open on
the file (the engine opens its own per request).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class FastFileWriterConfig:
    """DeepSpeed's fields. `dnvme_handle`: an aio handle (`aio_handle`); `pinned_tensor`: a
    contiguous CPU uint8 tensor, page-locked for speed (the staging buffer); the parallel
    writer fields are kept for DeepSpeed's callers (each writer writes its whole file)."""

    dnvme_handle: Any
    pinned_tensor: torch.Tensor
    double_buffer: bool = True
    num_parallel_writers: int = 1
    writer_rank: int = 0
    global_rank: int = 0


class FastFileWriter:
    """A write-only binary file object over an aio handle and a staging tensor."""

    def __init__(self, file_path: str, config: FastFileWriterConfig):
        self._path = os.fspath(file_path)
        self._handle = config.dnvme_handle
        staging = _checked_staging(config.pinned_tensor)
        for name in ("async_pwrite", "wait"):
            if not callable(getattr(self._handle, name, None)):
                raise ValueError(
                    f"FastFileWriterConfig.dnvme_handle: expected an aio handle (with {name}()); "
                    f"got {type(self._handle).__name__}"
                )
        halves = 2 if config.double_buffer else 1
        size = staging.numel() // halves
        self._buffers = [staging[i * size : (i + 1) * size] for i in range(halves)]
        self._current = 0  # the buffer being filled
        self._filled = 0  # bytes in it
        self._file_offset = 0  # where it goes in the file
        self._in_flight = False
        self._closed = False
        with open(self._path, "wb"):
            pass  # created, or emptied: the writes below start at offset 0
        self.stats = {"write_calls": 0, "bytes": 0, "disk_writes": 0}

    # --- the file object torch.save writes to --------------------------------------
    def write(self, data) -> int:
        self._check_open("write")
        view = memoryview(data).cast("B")
        n = len(view)
        with warnings.catch_warnings():  # read-only bytes: src is only ever read
            warnings.filterwarnings("ignore", "The given buffer is not writable")
            src = torch.frombuffer(view, dtype=torch.uint8) if n else None
        done = 0
        while done < n:
            buf = self._buffers[self._current]
            take = min(n - done, buf.numel() - self._filled)
            buf[self._filled : self._filled + take].copy_(src[done : done + take])  # type: ignore[index]
            self._filled += take
            done += take
            if self._filled == buf.numel():
                self._drain()
        self.stats["write_calls"] += 1
        self.stats["bytes"] += n
        return n

    def flush(self) -> None:
        """Nothing is held back from the file system beyond the staging buffer; `close`
        writes it (torch.save calls flush before it is done)."""
        self._check_open("flush")

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._file_offset + self._filled

    def close(self) -> None:
        """Writes what is staged, waits for every write, fsyncs the file."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._filled:
                self._drain()
            self._wait()
        finally:
            fd = os.open(self._path, os.O_WRONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "FastFileWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        if not getattr(self, "_closed", True):
            try:
                self.close()
            except Exception:  # noqa: BLE001 - nobody is left to report to
                pass

    # --- internals -----------------------------------------------------------------
    def _drain(self) -> None:
        """Issues the current buffer's write; the next buffer is filled meanwhile (its own
        earlier write is waited for first)."""
        buf = self._buffers[self._current][: self._filled]
        self._wait()  # with one buffer this is its own last write; with two, the other's
        self._handle.async_pwrite(buf, self._path, self._file_offset)
        self._in_flight = True
        self.stats["disk_writes"] += 1
        self._file_offset += self._filled
        self._filled = 0
        self._current = (self._current + 1) % len(self._buffers)
        if len(self._buffers) == 1:
            self._wait()

    def _wait(self) -> None:
        if self._in_flight:
            self._in_flight = False
            self._handle.wait()

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise ValueError(f"FastFileWriter.{what}: {self._path} is closed")


def _checked_staging(tensor) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(
            "FastFileWriterConfig.pinned_tensor: expected a torch.Tensor; got "
            f"{type(tensor).__name__}"
        )
    if tensor.device.type != "cpu" or tensor.dtype != torch.uint8 or not tensor.is_contiguous():
        raise ValueError(
            "FastFileWriterConfig.pinned_tensor: expected a contiguous CPU uint8 tensor; got "
            f"{tensor.dtype} on {tensor.device} (contiguous: {tensor.is_contiguous()})"
        )
    if tensor.numel() < 2:
        raise ValueError(
            f"FastFileWriterConfig.pinned_tensor: {tensor.numel()} bytes; at least 2 are needed "
            "(4 KiB or more for O_DIRECT writes)"
        )
    return tensor.view(-1)


__all__ = ["FastFileWriter", "FastFileWriterConfig"]
