"""DeepSpeed-compatible async I/O: ``AsyncIOBuilder().load().aio_handle(...)``.

Same constructor arguments, methods and return values as DeepSpeed's ``aio_handle``
(``csrc/aio/py_lib/py_ds_aio.cpp``), built on zerostream's engine. Differences that only
remove failure modes:

* every completion is checked: ``wait()`` raises ``OSError`` (``IoError``) naming the file,
  offset and errno instead of returning silently short data;
* reads past the end of a file raise ``ValueError`` at the call, never read zeros;
* any size, offset and buffer alignment work (no ``intra_op_parallelism`` divisibility
  rule, no padding): unaligned heads and tails go through a buffered descriptor, buffers
  that are not 4 KiB aligned bounce through reused aligned staging buffers;
* ``wait()`` releases the GIL, and worker threads never hold Python objects;
* the backend is io_uring, or a pread/pwrite thread pool where io_uring is unavailable
  (ds_config ``aio.backend``: ``auto|io_uring|threads``, a zerostream extension key).
"""

from __future__ import annotations

import os
import sys
from typing import Optional

import torch

from zerostream.offload.io_engine import IoEngine, IoTicket, io_config
from zerostream.offload.io_engine import IoError as IoError  # what wait() raises
from zerostream.offload.locked_tensors import locked_tensors


class aio_handle:  # noqa: N801 - DeepSpeed's name
    """DeepSpeed's ``aio_handle``: batched async file I/O with one ``wait()`` per batch."""

    def __init__(
        self,
        block_size: int = 1048576,
        queue_depth: int = 128,
        single_submit: bool = False,
        overlap_events: bool = False,
        intra_op_parallelism: int = 1,
        backend: str = "auto",
    ):
        self._config = io_config(
            block_size=block_size,
            queue_depth=queue_depth,
            threads=intra_op_parallelism,
            single_submit=single_submit,
            overlap_events=overlap_events,
            backend=backend,
        )
        self._engine = IoEngine(self._config)
        self._pending: list[tuple[IoTicket, Optional[tuple]]] = []

    # --- getters (DeepSpeed names) ---------------------------------------------------
    def get_block_size(self) -> int:
        return self._config.block_size

    def get_queue_depth(self) -> int:
        return self._config.queue_depth

    def get_single_submit(self) -> bool:
        return self._config.single_submit

    def get_overlap_events(self) -> bool:
        return self._config.overlap_events

    def get_intra_op_parallelism(self) -> int:
        return self._config.threads

    get_thread_count = get_intra_op_parallelism  # DeepSpeed < 0.16.4

    def get_alignment(self) -> int:
        return 4096  # full-speed O_DIRECT alignment; any alignment is correct

    def get_backend(self) -> str:
        return self._engine.backend

    # --- I/O -------------------------------------------------------------------------
    def pread(
        self,
        buffer: torch.Tensor,
        filename: str,
        validate: bool = False,
        async_op: bool = False,
        file_offset: int = 0,
        **kwargs,
    ) -> int:
        """Reads ``buffer.nbytes`` from ``filename`` at ``file_offset``. Returns 0 when
        async, else the count ``wait()`` returns. DeepSpeed's keyword ``async`` works."""
        async_op = bool(kwargs.pop("async", async_op))
        _reject_extra(kwargs, "pread")
        filename = os.fspath(filename)
        self._check_readable(buffer, filename, file_offset)
        ticket = self._engine.read(buffer, filename, file_offset)
        return self._queued(ticket, (buffer, filename, file_offset) if validate else None, async_op)

    def pwrite(
        self,
        buffer: torch.Tensor,
        filename: str,
        validate: bool = False,
        async_op: bool = False,
        file_offset: int = 0,
        **kwargs,
    ) -> int:
        async_op = bool(kwargs.pop("async", async_op))
        _reject_extra(kwargs, "pwrite")
        filename = os.fspath(filename)
        ticket = self._engine.write(buffer, filename, file_offset)
        return self._queued(ticket, (buffer, filename, file_offset) if validate else None, async_op)

    def sync_pread(self, buffer: torch.Tensor, filename: str, file_offset: int = 0) -> int:
        return self.pread(buffer, filename, False, False, file_offset)

    def sync_pwrite(self, buffer: torch.Tensor, filename: str, file_offset: int = 0) -> int:
        return self.pwrite(buffer, filename, False, False, file_offset)

    def async_pread(
        self, buffer: torch.Tensor, filename=None, file_offset: int = 0, fd=None
    ) -> int:
        """DeepSpeed's: the file by name, or by an open descriptor (`fd`)."""
        return self.pread(buffer, _file_of(filename, fd, "async_pread"), False, True, file_offset)

    def async_pwrite(
        self, buffer: torch.Tensor, filename=None, file_offset: int = 0, fd=None
    ) -> int:
        return self.pwrite(buffer, _file_of(filename, fd, "async_pwrite"), False, True, file_offset)

    def read(
        self, buffer: torch.Tensor, filename: str, validate: bool = False, file_offset: int = 0
    ) -> int:
        """Synchronous read of the whole buffer (DeepSpeed's ``read``); returns 0."""
        self.pread(buffer, filename, validate, False, file_offset)
        return 0

    def write(
        self, buffer: torch.Tensor, filename: str, validate: bool = False, file_offset: int = 0
    ) -> int:
        self.pwrite(buffer, filename, validate, False, file_offset)
        return 0

    def wait(self) -> int:
        """Waits for every request issued since the last wait; returns how many there were.

        All of them finish before the first failure (if any) is raised as ``IoError``.
        """
        pending, self._pending = self._pending, []
        first: Optional[BaseException] = None
        for ticket, check in pending:
            try:
                ticket.wait()  # releases the GIL
                if check is not None:
                    _validate(*check)
            except (OSError, RuntimeError, ValueError) as e:
                first = first or e
        # The engine keeps each request it was given (and so the request's open file, two
        # descriptors) until its own wait_all; every one of this handle's requests is done
        # and observed now, so this returns at once and closes them. Without it a handle
        # that writes a file that is then deleted (checkpoint rotation) held the deleted
        # file's blocks until the handle went.
        self._engine.wait_all()
        if first is not None:
            raise first
        return len(pending)

    # --- page-locked tensors -----------------------------------------------------------
    def new_cpu_locked_tensor(self, num_elem: int, example_tensor: torch.Tensor) -> torch.Tensor:
        """A page-locked CPU tensor of ``num_elem`` elements of ``example_tensor``'s dtype,
        from the process's locked tensors (offload/locked_tensors.py): every handle, and the
        pin_memory op, recognizes it."""
        return locked_tensors().new(
            int(num_elem), example_tensor.dtype, "aio_handle.new_cpu_locked_tensor"
        )

    def free_cpu_locked_tensor(self, tensor: torch.Tensor) -> bool:
        """Forgets a tensor from ``new_cpu_locked_tensor``; its memory returns to the
        arena when the last reference to it goes. False if it was not one of ours."""
        return locked_tensors().forget(tensor)

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        """Inside a locked tensor's range (views too), or pinned by torch."""
        return locked_tensors().is_pinned(tensor) or tensor.is_pinned()

    def pinned_stats(self) -> dict:
        return locked_tensors().stats()

    # --- internals -----------------------------------------------------------------------
    def _queued(self, ticket, check, async_op: bool) -> int:
        self._pending.append((ticket, check))
        return 0 if async_op else self.wait()

    @staticmethod
    def _check_readable(buffer: torch.Tensor, filename: str, file_offset: int) -> None:
        nbytes = buffer.numel() * buffer.element_size()
        try:
            size = os.stat(filename).st_size
        except OSError:
            return  # the engine raises IoError with the path and errno
        if file_offset + nbytes > size:
            raise ValueError(
                f"aio read of {filename}: {nbytes} bytes at offset {file_offset} "
                f"go past the end of the file ({size} bytes)"
            )

    def __del__(self):
        try:
            self.wait()
        except Exception:  # noqa: BLE001 - nobody is left to report to
            pass


def _file_of(filename, fd, name: str) -> str:
    """The path I/O goes to: `filename`, or the file an open descriptor names (Linux's
    /proc/self/fd). The engine opens its own descriptors (O_DIRECT where the filesystem
    allows), so the caller's stays untouched."""
    if (filename is None) == (fd is None):
        raise ValueError(f"aio_handle.{name}: give filename or fd, one of them")
    if filename is not None:
        return os.fspath(filename)
    try:
        path = os.readlink(f"/proc/self/fd/{int(fd)}")
    except OSError as exc:
        raise ValueError(f"aio_handle.{name}: fd {fd} is not an open file ({exc})") from None
    if not os.path.isfile(path):
        raise ValueError(f"aio_handle.{name}: fd {fd} names no file on disk ({path!r})")
    return path


def _reject_extra(kwargs: dict, name: str) -> None:
    if kwargs:
        raise TypeError(f"aio_handle.{name}() got unexpected keyword arguments {sorted(kwargs)}")


def _validate(buffer: torch.Tensor, filename: str, file_offset: int) -> None:
    """DeepSpeed's ``validate``: compare the buffer with the file through plain Python I/O."""
    nbytes = buffer.numel() * buffer.element_size()
    with open(filename, "rb") as f:
        f.seek(file_offset)
        on_disk = f.read(nbytes)
    if bytes(buffer.view(torch.uint8).numpy().tobytes()) != on_disk:
        raise RuntimeError(
            f"aio validate: {filename} at offset {file_offset} differs from the "
            f"buffer ({nbytes} bytes)"
        )


def aio_read(
    buffer: torch.Tensor,
    filename: str,
    block_size: int,
    queue_depth: int,
    single_submit: bool,
    overlap_events: bool,
    validate: bool,
) -> int:
    """DeepSpeed's module-level ``aio_read``."""
    h = aio_handle(block_size, queue_depth, single_submit, overlap_events, 1)
    return h.read(buffer, filename, validate)


def aio_write(
    buffer: torch.Tensor,
    filename: str,
    block_size: int,
    queue_depth: int,
    single_submit: bool,
    overlap_events: bool,
    validate: bool,
) -> int:
    h = aio_handle(block_size, queue_depth, single_submit, overlap_events, 1)
    return h.write(buffer, filename, validate)


def deepspeed_memcpy(dest: torch.Tensor, src: torch.Tensor) -> int:
    dest.copy_(src)
    return 0


class AsyncIOBuilder:
    """DeepSpeed's op builder for ``async_io``; nothing to compile here."""

    NAME = "async_io"
    BUILD_VAR = "DS_BUILD_AIO"

    def is_compatible(self, verbose: bool = False) -> bool:
        return True  # io_uring or the thread-pool fallback

    def absolute_name(self) -> str:
        return "zerostream.ops.aio"

    def load(self, verbose: bool = True):
        return sys.modules[__name__]
