"""Tensors whose bytes are still elsewhere (in a checkpoint file), read on demand into memory
the reader owns.

A load streams the large tensors of a checkpoint straight into the state they restore (a
module's weights, a stage's fp32 partitions, an NVMe swap store) instead of holding them
whole beside it (Note [Streamed checkpoint files] in checkpoint/stream.py). checkpoint/
makes them (its FileTensor); the stages and the offload layer consume them. This module is
the part both sides share, so that neither imports the other.
"""

from __future__ import annotations

from typing import Any

import torch


class LazyTensor:
    """A contiguous tensor not yet in memory: `shape`, `dtype`, and `read_into`, which fills
    a destination piece by piece (so the whole value never sits in memory twice)."""

    shape: torch.Size
    dtype: torch.dtype

    def numel(self) -> int:
        return self.shape.numel()

    def dim(self) -> int:
        return len(self.shape)

    def read_into(self, dst: torch.Tensor, lo: int = 0) -> torch.Tensor:
        """Elements [lo, lo + dst.numel()) of the flattened tensor into `dst` (cast to its
        dtype); returns dst."""
        raise NotImplementedError

    def materialize(self) -> torch.Tensor:
        return self.read_into(torch.empty(self.shape, dtype=self.dtype))


def copy_into(dst: torch.Tensor, src: Any) -> torch.Tensor:
    """dst.copy_(src) where src may be a LazyTensor (read straight into dst); a tensor is
    copied by element order (its shape may differ)."""
    if isinstance(src, LazyTensor):
        return src.read_into(dst.view(-1) if dst.is_contiguous() else dst)
    return dst.copy_(src.reshape(dst.shape))


def materialize(obj: Any) -> Any:
    """`obj` with every LazyTensor read into an ordinary tensor (plain containers kept)."""
    if isinstance(obj, LazyTensor):
        return obj.materialize()
    if isinstance(obj, dict):
        return type(obj)((k, materialize(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)) and not isinstance(obj, torch.Size):
        items = [materialize(v) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    return obj
