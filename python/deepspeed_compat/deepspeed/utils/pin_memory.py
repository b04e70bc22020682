"""`deepspeed.utils.pin_memory`: DeepSpeed's choice of pinned-memory backend
(`DS_PIN_MEMORY_BACKEND`: "torch", the default, or "native", the pin_memory op).

"native" is `NativePinnedMemory` over zerostream's locked tensors
(zerostream.offload.locked_tensors, reached through `PinMemoryBuilder().load().pin_handle()`
as in DeepSpeed): mlocked host memory tracked by address range, so views and slices of a
pinned tensor count as pinned, and shared with the aio handles' locked buffers. Its memory
returns when the last tensor over it goes; `unpin` stops tracking it at once. zerostream's
own offload pins its buffers in its arenas whichever backend is chosen."""

from __future__ import annotations

import torch

from zerostream.offload.locked_tensors import locked_tensors, native_backend


class NativePinnedMemory:
    """DeepSpeed's native pinning manager: pin (copy into locked memory), is_pinned, unpin."""

    def __init__(self):
        try:
            from deepspeed.ops import op_builder

            self._handle = op_builder.PinMemoryBuilder().load().pin_handle()
        except Exception as exc:
            raise RuntimeError(
                "DS_PIN_MEMORY_BACKEND=native requires the pin_memory op, which failed to "
                f"load ({exc}); unset DS_PIN_MEMORY_BACKEND for torch pinning"
            ) from exc
        self._ranges = locked_tensors().ranges  # begin -> end of every live locked tensor

    def pin(self, tensor: torch.Tensor, make_copy: bool = True, match_shape: bool = True):
        """A page-locked copy of `tensor` (its values unless `make_copy` is False, its
        shape unless `match_shape` is False), tagged `ds_pinned`."""
        return locked_tensors().pin(tensor, make_copy, match_shape)

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        return locked_tensors().is_pinned(tensor)

    def unpin(self, tensor: torch.Tensor) -> bool:
        """Stops tracking the range pinned for `tensor` (recorded at pin time); False when
        it was not pinned here. Its memory returns when the last tensor over it goes."""
        return locked_tensors().unpin(tensor)


_shared_native_pins = None


def get_native_pinned_memory() -> NativePinnedMemory:
    global _shared_native_pins
    if _shared_native_pins is None:
        _shared_native_pins = NativePinnedMemory()
    return _shared_native_pins


def get_active_native_pinned_memory():
    """The shared native manager when DS_PIN_MEMORY_BACKEND=native (RuntimeError naming the
    pin_memory op if it cannot load), else None (torch pinning)."""
    if not native_backend():
        return None
    return get_native_pinned_memory()


__all__ = ["NativePinnedMemory", "get_active_native_pinned_memory", "get_native_pinned_memory"]
