"""The staging buffers of the fast file writer (DeepSpeed's `deepspeed.io` IO buffers).

A buffer is a caller's page-locked uint8 tensor that the writer fills with the bytes torch
hands it and drains to the file through an aio handle:

    fill(src, offset) -> bytes taken   copies what fits from src[offset:]
    drain(n, file, file_offset)        writes the first n staged bytes at file_offset
    complete_ongoing_drain()           waits for a drain still in flight

`SingleIOBuffer` drains synchronously: fill, write, wait, fill again. `DoubleIOBuffer` splits
the tensor in two halves and writes one while the other fills; before a half is drained
again, the write of the other is waited for, so at most one write is in flight and no half
is overwritten while the disk still reads it.

Differences from DeepSpeed's buffers, which only remove failure modes: any size works (the
handle writes unaligned heads and tails through a buffered descriptor, so neither the tensor
nor a drain needs to be a multiple of `get_alignment()`, which the aligned/unaligned byte
counts still report), `file` is a path or an open descriptor, and a failed write raises the
handle's error naming the file.
"""

from __future__ import annotations

from typing import Any, List, Union

import torch

NUM_BUFFERS = 2
INVALID_BUFFER_INDEX = -1

FileRef = Union[str, int]  # a path, or an open descriptor (the handle resolves it)


class IOBuffer:
    """What both buffers share: the tensor, the handle, the copy and the write."""

    def __init__(self, pinned_tensor: torch.Tensor, dnvme_handle: Any, parts: int = 1):
        self._pinned_tensor = checked_staging(pinned_tensor, parts)
        self._dnvme_handle = checked_handle(dnvme_handle)

    # --- the interface the writer drives (the subclasses') -------------------------------
    def fill(self, src_tensor: torch.Tensor, src_offset: int) -> int:
        raise NotImplementedError

    def drain(self, num_bytes: int, fd: FileRef, file_offset: int) -> None:
        raise NotImplementedError

    def get_buffer(self) -> torch.Tensor:
        raise NotImplementedError

    def get_offset(self) -> int:
        raise NotImplementedError

    def is_full(self) -> bool:
        return self.get_offset() == self.get_buffer().numel()

    def is_empty(self) -> bool:
        raise NotImplementedError

    def reset(self) -> None:
        raise NotImplementedError

    def complete_ongoing_drain(self) -> None:
        pass

    # --- shared ------------------------------------------------------------------------
    def get_aligned_num_bytes(self) -> int:
        """Staged bytes up to the last whole `get_alignment()` block."""
        align = self._dnvme_handle.get_alignment()
        return self.get_offset() // align * align

    def get_unaligned_num_bytes(self) -> int:
        return self.get_offset() % self._dnvme_handle.get_alignment()

    def _drain(self, num_bytes: int, fd: FileRef, file_offset: int, blocking: bool) -> None:
        staged = self.get_offset()
        if not 0 < num_bytes <= staged:
            raise RuntimeError(f"IO buffer drain of {num_bytes} bytes; {staged} are staged")
        piece = self.get_buffer().narrow(0, 0, num_bytes)
        if isinstance(fd, int):
            self._dnvme_handle.async_pwrite(piece, fd=fd, file_offset=file_offset)
        else:
            self._dnvme_handle.async_pwrite(piece, fd, file_offset)
        if blocking:
            self._wait_one()

    def _wait_one(self) -> None:
        done = self._dnvme_handle.wait()
        if done != 1:
            raise RuntimeError(f"IO buffer: the handle completed {done} writes; 1 was issued")

    @staticmethod
    def fill_buffer(
        src_tensor: torch.Tensor, src_offset: int, buffer_tensor: torch.Tensor, buffer_offset: int
    ) -> int:
        """Copies what fits of src_tensor[src_offset:] into buffer_tensor[buffer_offset:];
        returns the count."""
        if not 0 <= src_offset < src_tensor.numel():
            raise RuntimeError(f"IO buffer fill from offset {src_offset} of {src_tensor.numel()}")
        take = min(src_tensor.numel() - src_offset, buffer_tensor.numel() - buffer_offset)
        if take > 0:
            buffer_tensor.narrow(0, buffer_offset, take).copy_(
                src_tensor.narrow(0, src_offset, take)
            )
        return max(take, 0)


class SingleIOBuffer(IOBuffer):
    """The whole tensor, drained synchronously."""

    def __init__(self, pinned_tensor: torch.Tensor, dnvme_handle: Any):
        super().__init__(pinned_tensor, dnvme_handle)
        self._pinned_offset = 0

    def fill(self, src_tensor: torch.Tensor, src_offset: int) -> int:
        n = self.fill_buffer(src_tensor, src_offset, self._pinned_tensor, self._pinned_offset)
        self._pinned_offset += n
        return n

    def drain(self, num_bytes: int, fd: FileRef, file_offset: int) -> None:
        self._drain(num_bytes, fd, file_offset, blocking=True)
        self._pinned_offset = 0

    def get_buffer(self) -> torch.Tensor:
        return self._pinned_tensor

    def get_offset(self) -> int:
        return self._pinned_offset

    def is_empty(self) -> bool:
        return self._pinned_offset == 0

    def reset(self) -> None:
        self._pinned_offset = 0


class DoubleIOBuffer(IOBuffer):
    """Two halves: one fills while the other's write is in flight."""

    def __init__(self, pinned_tensor: torch.Tensor, dnvme_handle: Any):
        super().__init__(pinned_tensor, dnvme_handle, parts=NUM_BUFFERS)
        half = self._pinned_tensor.numel() // NUM_BUFFERS
        self._buffers: List[torch.Tensor] = [
            self._pinned_tensor.narrow(0, i * half, half) for i in range(NUM_BUFFERS)
        ]
        self._fill_index = 0
        self._drain_index = INVALID_BUFFER_INDEX
        self._buffer_offset = 0

    def fill(self, src_tensor: torch.Tensor, src_offset: int) -> int:
        target = self._buffers[self._fill_index]
        n = self.fill_buffer(src_tensor, src_offset, target, self._buffer_offset)
        self._buffer_offset += n
        return n

    def drain(self, num_bytes: int, fd: FileRef, file_offset: int) -> None:
        """Issues the filling half's write, after the other half's has finished; the
        other half fills next."""
        self.complete_ongoing_drain()
        self._drain(num_bytes, fd, file_offset, blocking=False)
        self._drain_index = self._fill_index
        self._fill_index = (self._fill_index + 1) % NUM_BUFFERS
        self._buffer_offset = 0

    def get_buffer(self) -> torch.Tensor:
        return self._buffers[self._fill_index]

    def get_offset(self) -> int:
        return self._buffer_offset

    def is_empty(self) -> bool:
        return self._buffer_offset == 0 and self._drain_index == INVALID_BUFFER_INDEX

    def reset(self) -> None:
        self._buffer_offset = 0

    def complete_ongoing_drain(self) -> None:
        if self._drain_index != INVALID_BUFFER_INDEX:
            self._drain_index = INVALID_BUFFER_INDEX  # cleared first: a failed wait ends it
            self._wait_one()


def checked_staging(tensor: Any, parts: int = 1) -> torch.Tensor:
    """The staging tensor as a flat uint8 view; a ValueError naming
    `FastFileWriterConfig.pinned_tensor` for anything else."""
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
    if tensor.numel() < parts:
        raise ValueError(
            f"FastFileWriterConfig.pinned_tensor: {tensor.numel()} bytes; at least {parts} "
            "are needed (4 KiB or more for O_DIRECT writes)"
        )
    return tensor.view(-1)


def checked_handle(handle: Any) -> Any:
    for name in ("async_pwrite", "wait", "get_alignment"):
        if not callable(getattr(handle, name, None)):
            raise ValueError(
                f"FastFileWriterConfig.dnvme_handle: expected an aio handle (with {name}()); "
                f"got {type(handle).__name__}"
            )
    return handle


# DeepSpeed's class names.
Base_IO_Buffer = IOBuffer
Single_IO_Buffer = SingleIOBuffer
Double_IO_Buffer = DoubleIOBuffer

__all__ = [
    "NUM_BUFFERS",
    "INVALID_BUFFER_INDEX",
    "IOBuffer",
    "SingleIOBuffer",
    "DoubleIOBuffer",
    "Base_IO_Buffer",
    "Single_IO_Buffer",
    "Double_IO_Buffer",
]
