"""File objects that `torch.save` writes checkpoints into (DeepSpeed's `deepspeed.io`).

    with PyFileWriter(path) as f:      # plain Python file I/O
        torch.save(state, f)
    f = MockFileWriter(path)           # counts what would be written, writes nothing
    torch.save(state, f); f.close()    # f.stats["bytes"] == the size torch.save gives

Every writer keeps DeepSpeed's statistics under DeepSpeed's keys (the `*_KEY` names below):
calls of `write`, `flush`, `fileno` and `close`, bytes written and seconds spent writing;
`_dump_state()` prints them with the path and the speed. `fileno()` answers `INVALID_FD`
on purpose: torch's legacy (non-zip) serializer writes storages straight into a file
descriptor it is given, which would bypass the writer; -1 makes it call `write` instead.

The fast writer (fast_file_writer.py) is a BaseFileWriter too.
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict

from .storage_bytes import STORAGE_SIZE_BYTES, storage_details

INVALID_FD = -1

# DeepSpeed's statistics keys (`deepspeed.io.constants`).
FILE_PATH_KEY = "path"
FLUSH_COUNT_KEY = "flush"
WRITE_COUNT_KEY = "write"
CLOSE_COUNT_KEY = "close"
FILENO_COUNT_KEY = "fileno"
WRITE_BYTES_KEY = "bytes"
WRITE_SEC_KEY = "write_secs"
WRITE_SPEED_KEY = "write_GB/s"

AIO_WRITE_SEC_KEY = "aio_write_secs"
AIO_WRITE_BYTES_KEY = "aio_bytes"
AIO_SPEED_KEY = "aio_GB/s"
SLOW_WRITE_BYTES_KEY = "slow_bytes"
SLOW_WRITE_SEC_KEY = "slow_write_secs"
AIO_FILL_BUFFER_SEC_KEY = "fill_buffer_secs"
AIO_FILL_BUFFER_COUNT_KEY = "fill_buffer_count"
AIO_FILL_BUFFER_SPEED_KEY = "fill_buffer_GB/s"

SAVE_STORAGE_KEY = "save_storage"
SAVE_STORAGE_BYTES_KEY = "save_storage_bytes"
SAVE_STORAGE_SEC_KEY = "save_storage_secs"
STORAGE_OBJ_SIZE = STORAGE_SIZE_BYTES

RANK_KEY = "rank"

BASE_STAT_KEYS = [
    CLOSE_COUNT_KEY,
    FILENO_COUNT_KEY,
    FLUSH_COUNT_KEY,
    WRITE_COUNT_KEY,
    WRITE_BYTES_KEY,
    WRITE_SEC_KEY,
    WRITE_SPEED_KEY,
]

GIB = 1024**3


class BaseFileWriter:
    """What every writer has: its path and its statistics. The I/O methods are the
    subclasses'; here they do nothing, as DeepSpeed's base."""

    def __init__(self, file_path):
        self._file_path = os.fspath(file_path)
        self._stats: Dict[str, Any] = {k: 0 for k in BASE_STAT_KEYS}

    def close(self) -> None:
        pass

    def fileno(self) -> int:
        return INVALID_FD

    def flush(self) -> None:
        pass

    def write(self, buffer) -> int:
        return 0

    def writable(self) -> bool:
        return True

    def file_path(self) -> str:
        return self._file_path

    @property
    def stats(self) -> Dict[str, Any]:
        """A copy of the statistics, by DeepSpeed's keys."""
        return dict(self._stats)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _incr_stats(self, key: str, incr=1) -> None:
        self._stats[key] += incr

    def _speeds(self) -> None:
        """Fills the GB/s entries the subclass measures (the base: write speed)."""
        if self._stats[WRITE_SEC_KEY] > 0:
            self._stats[WRITE_SPEED_KEY] = self._stats[WRITE_BYTES_KEY] / (
                self._stats[WRITE_SEC_KEY] * GIB
            )

    def _dump_state(self) -> Dict[str, Any]:
        """Prints the statistics with the path and speeds (DeepSpeed's show_statistics);
        returns them."""
        self._speeds()
        self._stats[FILE_PATH_KEY] = self.file_path()
        print(f"stats = {self._stats}")
        return self.stats


class PyFileWriter(BaseFileWriter):
    """Writes through a plain Python binary file (created or emptied on construction)."""

    def __init__(self, file_path):
        super().__init__(file_path)
        self._fp = open(self._file_path, "wb")

    def close(self) -> None:
        self._incr_stats(CLOSE_COUNT_KEY)
        self._fp.close()

    def fileno(self) -> int:
        self._incr_stats(FILENO_COUNT_KEY)
        return INVALID_FD

    def flush(self) -> None:
        self._incr_stats(FLUSH_COUNT_KEY)
        self._fp.flush()

    def write(self, buffer) -> int:
        start = time.perf_counter()
        n = self._fp.write(buffer)
        self._incr_stats(WRITE_SEC_KEY, time.perf_counter() - start)
        self._incr_stats(WRITE_COUNT_KEY)
        self._incr_stats(WRITE_BYTES_KEY, n)
        return n

    @property
    def closed(self) -> bool:
        return self._fp.closed


class MockFileWriter(BaseFileWriter):
    """Counts the calls and bytes a save would write, and writes none of them: the file is
    created empty (as DeepSpeed's mock does) and stays so. For measuring what a checkpoint
    costs to serialize apart from the disk."""

    def __init__(self, file_path):
        super().__init__(file_path)
        open(self._file_path, "wb").close()
        self._stats[SAVE_STORAGE_KEY] = 0
        self._stats[SAVE_STORAGE_BYTES_KEY] = 0
        self._closed = False

    def close(self) -> None:
        self._incr_stats(CLOSE_COUNT_KEY)
        self._closed = True

    def fileno(self) -> int:
        self._incr_stats(FILENO_COUNT_KEY)
        return INVALID_FD

    def flush(self) -> None:
        self._incr_stats(FLUSH_COUNT_KEY)

    def write(self, buffer) -> int:
        if self._closed:
            raise ValueError(f"MockFileWriter.write: {self._file_path} is closed")
        return self._count(memoryview(buffer).nbytes)

    def save_torch_storage_object_list(self, storage_obj_list, save_size: bool) -> int:
        """The bytes the fast writer would write for these storages: each one's bytes,
        preceded by its 8-byte element count when `save_size`. (DeepSpeed's mock counts a
        storage's elements as its bytes; here they are its bytes.)"""
        total = 0
        for item in storage_obj_list:
            d = storage_details(item)
            self._incr_stats(SAVE_STORAGE_KEY)
            self._incr_stats(SAVE_STORAGE_BYTES_KEY, d.nbytes)
            if save_size:
                total += self._count(STORAGE_OBJ_SIZE)
            total += self._count(d.nbytes)
        return total

    @property
    def closed(self) -> bool:
        return self._closed

    def _count(self, num_bytes: int) -> int:
        self._incr_stats(WRITE_COUNT_KEY)
        self._incr_stats(WRITE_BYTES_KEY, num_bytes)
        return num_bytes


__all__ = [
    "INVALID_FD",
    "BASE_STAT_KEYS",
    "BaseFileWriter",
    "PyFileWriter",
    "MockFileWriter",
]
