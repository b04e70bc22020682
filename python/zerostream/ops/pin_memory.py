"""DeepSpeed's pin_memory op: ``PinMemoryBuilder().load().pin_handle()``, the page-locked
allocator without the async I/O handle around it (DeepSpeed builds it without libaio).

Its buffers come from the process's locked tensors (offload/locked_tensors.py), the same
ones ``aio_handle.new_cpu_locked_tensor`` hands out, so either handle recognizes the
other's buffers and their views. Nothing is compiled at run time: ``load()`` returns this
module.
"""

from __future__ import annotations

import sys

import torch

from zerostream.offload.locked_tensors import locked_tensors


class pin_handle:  # noqa: N801 - DeepSpeed's name
    """Allocates, frees and recognizes page-locked CPU tensors."""

    def new_cpu_locked_tensor(self, num_elem: int, example_tensor: torch.Tensor) -> torch.Tensor:
        """A 1-D page-locked tensor of ``num_elem`` elements of ``example_tensor``'s dtype."""
        if not isinstance(example_tensor, torch.Tensor):
            raise ValueError(
                "pin_handle.new_cpu_locked_tensor: example_tensor must be a torch.Tensor "
                f"(its dtype is used); got {type(example_tensor).__name__}"
            )
        return locked_tensors().new(
            int(num_elem), example_tensor.dtype, "pin_handle.new_cpu_locked_tensor"
        )

    def free_cpu_locked_tensor(self, tensor: torch.Tensor) -> bool:
        """Stops tracking a tensor from ``new_cpu_locked_tensor`` (False if it is not one);
        its memory returns to the arena when the last tensor over it goes."""
        return locked_tensors().forget(tensor)

    def free_cpu_locked_tensor_by_ptr(self, ptr: int) -> bool:
        """``free_cpu_locked_tensor`` by the address the tensor began at."""
        return locked_tensors().forget(int(ptr))

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        """Whether the tensor lies inside a locked tensor (views and slices included)."""
        return locked_tensors().is_pinned(tensor)


class PinMemoryBuilder:
    """DeepSpeed's op builder for ``pin_memory``; nothing to compile here."""

    NAME = "pin_memory"
    BUILD_VAR = "DS_BUILD_PIN_MEMORY"

    def is_compatible(self, verbose: bool = False) -> bool:
        return True  # mlock needs no library; an over-limit lock fails at the allocation

    def absolute_name(self) -> str:
        return "zerostream.ops.pin_memory"

    def load(self, verbose: bool = True):
        return sys.modules[__name__]


__all__ = ["PinMemoryBuilder", "pin_handle"]
