"""Pageable host buffers aligned for O_DIRECT: what checkpoints, swap files and the CPU
optimizers' large state tensors are allocated from, so the I/O engine reads and writes them
straight instead of through its bounce buffers (Note [Bounce buffers] in offload/). Plain
torch memory: no arena, no budget. A module of its own, below both ops/ and offload/ (the
CPU optimizers allocate here; offload/host_buffers.py re-exports it beside its arenas)."""

from __future__ import annotations

import torch

DIRECT_ALIGN = 4096  # O_DIRECT's buffer alignment on the filesystems the engine meets


def aligned_empty(shape, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """An uninitialised tensor whose data starts on a DIRECT_ALIGN boundary. torch's allocator
    aligns to 64 B, and the engine reads or writes a buffer misaligned against its file
    offset through 1 MiB bounce buffers on its completion thread (1.1-1.7 GB/s on the dev
    VM's disk against 2.5-2.6 straight): large tensors that checkpoints or swap files move
    should come from here."""
    shape = torch.Size(shape if isinstance(shape, (tuple, list, torch.Size)) else (shape,))
    nbytes = shape.numel() * dtype.itemsize
    raw = torch.empty(nbytes + DIRECT_ALIGN, dtype=torch.uint8)
    skip = (-raw.data_ptr()) % DIRECT_ALIGN
    return raw[skip : skip + nbytes].view(dtype).view(shape)
