"""CRC32C (offload/crc32c.h): what the swap store keeps per extent
(zerostream.verify_swap_checksums) and a checkpoint's manifest per file range."""

from __future__ import annotations

import torch

from zerostream import _C

from .host_buffers import tensor_span


def crc32c(tensor: torch.Tensor, crc: int = 0) -> int:
    """The CRC32C of a contiguous CPU tensor's bytes, continuing from `crc`."""
    ptr, nbytes = tensor_span(tensor, "crc32c")
    return _C.offload.crc32c(ptr, nbytes, int(crc))


def crc32c_at(ptr: int, nbytes: int, crc: int = 0) -> int:
    """crc32c() over `nbytes` at address `ptr` (a buffer that is not a tensor)."""
    return _C.offload.crc32c(int(ptr), int(nbytes), int(crc))
