"""Host memory for the offload tiers and the CPU kernels: the (pointer, bytes) of a tensor the
native core works on, pageable buffers aligned for O_DIRECT, and page-locked arenas under a
byte budget whose buffers may be registered with the GPU.

    buf = aligned_empty(1 << 20, torch.float32)        # pageable, 4 KiB aligned, no budget
    arena = HostArena(budget_bytes=1 << 30)
    pinned = arena.empty(1 << 20, torch.float32)       # page-locked, returns when torch frees it

What the process may still allocate before it does (the preflight) is memory_preflight.py;
the files these buffers are read from and written to are io_engine.py and swap_store.py.
"""

from __future__ import annotations

import weakref
from typing import Optional

import torch

from zerostream import _C

# Pageable O_DIRECT-aligned buffers live below ops/ and offload/ both; re-exported here.
from zerostream.aligned import DIRECT_ALIGN, aligned_empty  # noqa: F401
from zerostream.sizing import arena_bytes  # noqa: F401  (re-exported: the arena's unit)

_N = _C.offload


def tensor_span(tensor: torch.Tensor, what: str = "tensor") -> tuple[int, int]:
    """(data pointer, bytes) of a contiguous CPU tensor; ValueError otherwise."""
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"{what}: expected a torch.Tensor; got {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise ValueError(f"{what}: expected a CPU tensor; got device {tensor.device}")
    if not tensor.is_contiguous():
        raise ValueError(
            f"{what}: expected a contiguous tensor (shape {tuple(tensor.shape)}, "
            f"stride {tensor.stride()})"
        )
    return tensor.data_ptr(), tensor.numel() * tensor.element_size()


def populate(tensor: torch.Tensor) -> torch.Tensor:
    """Faults in a contiguous CPU tensor's pages, bytes unchanged, before a read fills it
    (Note [Populate before reading] in offload/populate.h); returns the tensor."""
    ptr, nbytes = tensor_span(tensor, "populate")
    _N.populate(ptr, nbytes)
    return tensor


def buffer_as_tensor(buffer: "_N.HostBuffer", numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A zero-copy tensor over an arena buffer; the tensor's storage owns the buffer."""
    raw = torch.from_dlpack(buffer.to_dlpack())
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    return raw[:nbytes].view(dtype)


# Set by zerostream.testing.sim_device while a test runs on the simulated device: told of
# every buffer handed out by an arena that registers its memory with the GPU.
registration_observer = None


class HostArena:
    """Page-locked host memory under one byte budget; over-budget requests wait.

    `register`: the buffers cross to a GPU (copy-stage slots, offloaded partitions, stage-3
    shards, their staging): registered with CUDA on a GPU machine, so copies from and to
    them are asynchronous DMA. Buffers that only go to disk or the CPU kernels are not.
    `pooled`: the whole budget is mapped, locked and registered once and buffers are carved
    out of it (Note [Pooled host arenas] in offload/host_arena.h): for arenas that hand out
    and take back buffers during a step. `lock` False (pin_memory false) neither locks nor
    registers."""

    def __init__(
        self, budget_bytes: int, lock: bool = True, register: bool = False, pooled: bool = False
    ):
        self.registers = bool(lock and register)
        self._arena = _N.HostArena(int(budget_bytes), lock, self.registers, pooled)
        _LIVE_ARENAS.add(self)

    def _handed_out(self, buf, numel: int, dtype: torch.dtype) -> torch.Tensor:
        t = buffer_as_tensor(buf, numel, dtype)
        if self.registers and registration_observer is not None:
            registration_observer(t)
        return t

    def empty(
        self, numel: int, dtype: torch.dtype = torch.uint8, timeout_s: float = 60.0
    ) -> torch.Tensor:
        """A 1-D tensor of ``numel`` elements; its memory returns when torch frees it."""
        if numel < 0:
            raise ValueError(f"HostArena.empty: numel must be >= 0; got {numel}")
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        buf = self._arena.allocate(nbytes, float(timeout_s))
        return self._handed_out(buf, numel, dtype)

    def try_empty(self, numel: int, dtype: torch.dtype = torch.uint8) -> Optional[torch.Tensor]:
        """Like `empty`, but None instead of waiting when the budget is in use."""
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        buf = self._arena.try_allocate(nbytes)
        return None if buf is None else self._handed_out(buf, numel, dtype)

    def stats(self) -> dict:
        return self._arena.stats()


_LIVE_ARENAS: "weakref.WeakSet[HostArena]" = weakref.WeakSet()
_TOTALED = (
    "budget",
    "in_use",
    "peak",
    "registrations",
    "registered",
    "register_failed",
    "pool_misses",
)


def arena_totals() -> dict:
    """Budget, bytes in use and the sum of each arena's peak over the arenas alive in this
    process (the engine's swap buffers, staging, the aio handle's): what a run's summary
    reports as host-arena memory. The peaks are per arena, so their sum bounds the true
    simultaneous peak from above."""
    stats = [arena.stats() for arena in list(_LIVE_ARENAS)]
    return {"arenas": len(stats), **{k: sum(int(s[k]) for s in stats) for k in _TOTALED}}
