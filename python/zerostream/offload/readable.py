"""What a consumer of tensors accepts in place of one whose bytes are still elsewhere: a
checkpoint's FileTensor (checkpoint/stream.py, read_file(lazy=True)) is read piece by piece
into the consumer's own memory, so a large optimizer state never sits whole in host memory
beside its destination. The CPU optimizers' load_state_dict and the NVMe optimizer swapper
take either; this type is how they tell the two apart (structurally: FileTensor need not
name it)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class ReadableTensor(Protocol):
    """A contiguous tensor not in memory: its shape and dtype, and a read of elements
    [lo, lo + dst.numel()) of its flattened form into `dst` (cast to dst's dtype)."""

    shape: torch.Size
    dtype: torch.dtype

    def numel(self) -> int: ...

    def read_into(self, dst: torch.Tensor, lo: int = 0) -> torch.Tensor: ...
