"""The process's page-locked CPU tensors handed out to callers (DeepSpeed's pinned-tensor
manager): the aio handles' `new_cpu_locked_tensor`, the pin_memory op's `pin_handle` and
the native pinning backend (`NativePinnedMemory`) all allocate here, so a buffer locked
through one is recognized by every other, views and slices included.

    t = locked_tensors().new(4096, torch.float32)   # mlocked, from one HostArena
    locked_tensors().is_pinned(t.narrow(0, 16, 16)) # True: the pointer is inside t's range
    locked_tensors().forget(t)                      # True; False for a tensor not ours

Lifetime follows torch's: the memory (an arena buffer) returns to the arena when the last
tensor over it goes, never earlier, so a live view can never alias freed memory. `forget`
only stops tracking the range (is_pinned turns False); a range is also dropped by itself
when its tensor and every view of it are garbage-collected.

Page-locked means mlock(2)ed: the kernel keeps the pages resident (they count in the
process's VmLck). On a GPU machine torch's own pinning (cudaHostAlloc) is what makes copies
asynchronous; these buffers are what O_DIRECT I/O and the CPU kernels read and write.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Optional

import torch

from zerostream.offload.host_buffers import HostArena


def default_pinned_budget() -> int:
    """The locked tensors' byte budget: ZS_AIO_PINNED_BUDGET, else half the machine's RAM
    (DeepSpeed's allocator has none)."""
    env = os.environ.get("ZS_AIO_PINNED_BUDGET")
    if env:
        return int(env)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError):
        return 8 << 30


def has_storage(tensor: torch.Tensor) -> bool:
    """False for tensors whose data pointer means nothing (meta, fake tensors)."""
    if tensor.is_meta or type(tensor).__name__ == "FakeTensor":
        return False
    return tensor.device.type == "cpu"


class LockedTensors:
    """Page-locked CPU tensors by address range: begin pointer -> end pointer."""

    def __init__(self, budget_bytes: Optional[int] = None):
        self._budget = budget_bytes
        self._arena: Optional[HostArena] = None
        self._mutex = threading.RLock()  # finalizers may run inside a locked call (GC)
        self.ranges: dict[int, int] = {}
        self._finalizers: dict[int, weakref.finalize] = {}

    def new(self, num_elem: int, dtype: torch.dtype, what: str = "locked tensor") -> torch.Tensor:
        """A 1-D page-locked tensor of `num_elem` elements of `dtype`."""
        if isinstance(num_elem, bool) or not isinstance(num_elem, int) or num_elem < 0:
            raise ValueError(f"{what}: num_elem must be an int >= 0; got {num_elem!r}")
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"{what}: dtype must be a torch.dtype; got {dtype!r}")
        with self._mutex:
            if self._arena is None:
                budget = self._budget if self._budget is not None else default_pinned_budget()
                self._arena = HostArena(budget)
            arena = self._arena
        tensor = arena.empty(num_elem, dtype)
        begin = tensor.data_ptr()
        with self._mutex:
            self.ranges[begin] = begin + tensor.nbytes
            # Every view's _base is this tensor (the arena's tensors have none), so the
            # finalizer runs once the tensor and all its views are gone.
            self._finalizers[begin] = weakref.finalize(tensor, self._drop, begin)
        return tensor

    def track(self, tensor: torch.Tensor) -> torch.Tensor:
        """Tracks a page-locked tensor another arena made (an offloaded optimizer's buffers
        under the native backend: DeepSpeed pins those through this manager too), until
        `forget` or until it and its views are gone. Returns the tensor."""
        begin = tensor.data_ptr()
        with self._mutex:
            self.ranges[begin] = begin + tensor.nbytes
            self._finalizers[begin] = weakref.finalize(tensor, self._drop, begin)
        return tensor

    def forget(self, tensor_or_ptr) -> bool:
        """Stops tracking the range that begins at the tensor's data pointer (or at an int
        address); False when no tracked range begins there."""
        begin = tensor_or_ptr if isinstance(tensor_or_ptr, int) else tensor_or_ptr.data_ptr()
        with self._mutex:
            finalizer = self._finalizers.pop(begin, None)
            if finalizer is not None:
                finalizer.detach()
            return self.ranges.pop(begin, None) is not None

    def is_pinned(self, tensor: torch.Tensor) -> bool:
        """Whether the tensor's data lies inside a tracked range (views and slices too)."""
        if getattr(tensor, "ds_pinned", False):
            return True
        if not has_storage(tensor):
            return False
        ptr = tensor.data_ptr()
        with self._mutex:
            return any(begin <= ptr < end for begin, end in self.ranges.items())

    def pin(
        self, tensor: torch.Tensor, make_copy: bool = True, match_shape: bool = True
    ) -> torch.Tensor:
        """A locked tensor of `tensor`'s dtype and element count: its values when
        `make_copy`, its shape when `match_shape` (else flat). Tagged ``ds_pinned`` (True)
        and ``ds_pin_base`` (the range's begin, which `unpin` forgets even after the
        tensor's ``.data`` is rebound), as DeepSpeed's native backend tags it."""
        if not isinstance(tensor, torch.Tensor) or not has_storage(tensor):
            got = getattr(tensor, "device", type(tensor).__name__)
            raise ValueError(
                f"pin_memory: tensor must be a CPU torch.Tensor with storage; got {got}"
            )
        locked = self.new(tensor.numel(), tensor.dtype, "pin_memory")
        begin = locked.data_ptr()
        if make_copy:
            locked.copy_(tensor.reshape(-1))
        if match_shape:
            locked = locked.view(tensor.shape)
        locked.ds_pinned = True  # type: ignore[attr-defined]  # DeepSpeed's tags
        locked.ds_pin_base = begin  # type: ignore[attr-defined]
        return locked

    def unpin(self, tensor: torch.Tensor) -> bool:
        """Forgets the range `pin` made for `tensor`; False when it has none here."""
        begin = getattr(tensor, "ds_pin_base", None)
        forgotten = self.forget(tensor.data_ptr() if begin is None else int(begin))
        if hasattr(tensor, "ds_pinned"):
            tensor.ds_pinned = False
        return forgotten

    def stats(self) -> dict:
        with self._mutex:
            arena = self._arena.stats() if self._arena is not None else {}
            return {"tensors": len(self.ranges), **arena}

    def _drop(self, begin: int) -> None:
        with self._mutex:
            self.ranges.pop(begin, None)
            self._finalizers.pop(begin, None)


def native_backend() -> bool:
    """DeepSpeed's DS_PIN_MEMORY_BACKEND=native: the accelerator pins into these tensors
    (else torch pins, the default "torch")."""
    return os.environ.get("DS_PIN_MEMORY_BACKEND", "torch").strip().lower() == "native"


_shared: Optional[LockedTensors] = None
_shared_mutex = threading.Lock()


def locked_tensors() -> LockedTensors:
    """The process's one manager (DeepSpeed's is process-wide too)."""
    global _shared
    with _shared_mutex:
        if _shared is None:
            _shared = LockedTensors()
        return _shared


__all__ = [
    "LockedTensors",
    "default_pinned_budget",
    "has_storage",
    "locked_tensors",
    "native_backend",
]
