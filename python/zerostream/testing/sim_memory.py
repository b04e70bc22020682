"""The simulated device's memory (Note [The simulated device] in sim_device.py): how many bytes
of device memory the program holds, and their peak, as torch.cuda.memory_allocated and
max_memory_allocated would say on a GPU; what the caching allocator keeps (memory_reserved);
with a capacity, holding more is reported as a violation (out of memory), and
accelerator.memory_room() answers from it.

Every storage an op on the device creates counts, at its size of the moment, from that op
until the last tensor on it is gone, the program's or a queued copy's (the sim lets go of a
download's device side once the copy ran: record_stream's promise is kept then). Host memory
registered with the device (page-locked arenas, the copy stage's slots) is not device memory
and does not count. Frees are seen at the next op, before its outputs count, so the peak is
exact at every allocation, which is where a peak can happen. Tracking costs a pass over the
live storages per op: for the tests' tiny models only.

Note [The caching allocator model]
  A GPU's caching allocator does not give a freed block back to the device: it caches it
  for the next allocation, and only for allocations on the stream the block was allocated
  on (its allocation stream), because only that stream's later work is ordered after the
  free. Modelled here by bytes, not blocks: each storage remembers the stream current when
  it was made; its bytes, when freed, go to that stream's cache; an allocation on a stream
  takes from that stream's cache when it holds enough, else the device reserves more.
  reserved = held + cached, as memory_reserved says, so memory another stream freed is not
  reused (a buffer made while a lane is current and used on the compute stream grows the
  reservation), and a missing empty_cache() leaves it reserved, where another process
  cannot use it. A storage resized to nothing (stage 3's free of a gathered parameter) is a
  free of its bytes, and resizing it back an allocation. When held + cached would exceed a
  capacity, the cache is given back first (the allocator frees its cached blocks and
  retries, a device-wide synchronization on a GPU): counted as a cache flush. Freed while a
  queued copy on another stream still uses it, a block is safe only if record_stream told
  the allocator (sim_device's _execute checks; a block its own stream frees is always safe).
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._pytree import tree_leaves


class DeviceMemory:
    def __init__(self, sim):
        self.sim = sim
        # The storage's identity (its StorageImpl, which a resize keeps) -> (a weak reference,
        # the bytes counted for it, its allocation stream)
        self.live: Dict[int, Tuple[StorageWeakRef, int, object]] = {}
        self.current = 0
        self.peak = 0
        self.capacity = None  # installed(device_capacity=...): more is out of memory
        self.over = False
        self.cached: Dict[object, int] = {}  # allocation stream -> freed bytes kept for it
        self.emptied = 0  # empty_cache() calls
        self.flushes = 0  # the cache given back because an allocation needed the room

    @property
    def reserved(self) -> int:
        return self.current + sum(self.cached.values())

    def room(self):
        """accelerator.memory_room()'s answer: (capacity - held, peak - held, capacity)."""
        self._sweep()
        return self.capacity - self.current, self.peak - self.current, self.capacity

    def stream_of(self, storage: torch.UntypedStorage) -> Optional[object]:
        """The allocation stream of a storage the model counts, else None."""
        entry = self.live.get(storage._cdata)
        return entry[2] if entry is not None else None

    def _free(self, nbytes: int, stream) -> None:
        self.current -= nbytes
        self.cached[stream] = self.cached.get(stream, 0) + nbytes

    def _take(self, nbytes: int, stream) -> None:
        self.current += nbytes
        cached = self.cached.get(stream, 0)
        if cached >= nbytes:
            self.cached[stream] = cached - nbytes
        elif self.capacity is not None and self.reserved > self.capacity:
            self.cached.clear()  # cudaFree of every cached block, then the retry
            self.flushes += 1

    def _sweep(self) -> None:
        """Drops the storages gone and recounts the others at their size now: stage 3 frees
        a gathered parameter by resizing its storage to nothing and gathers into it again."""
        for key, (ref, counted, stream) in list(self.live.items()):
            if ref.expired():
                self._free(counted, stream)
                del self.live[key]
                continue
            now = torch.UntypedStorage._new_with_weak_ptr(ref.cdata).nbytes()
            if now < counted:
                self._free(counted - now, stream)
            elif now > counted:
                self._take(now - counted, stream)
            if now != counted:
                self.live[key] = (ref, now, stream)

    def allocated(self, out, stream) -> None:
        """Counts the storages of an op's outputs that are new device memory, made while
        `stream` was current."""
        self._sweep()
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            lo, nbytes = storage.data_ptr(), storage.nbytes()
            key = storage._cdata
            if nbytes == 0 or key in self.live or not self.sim.tags.has(t):
                continue
            if self.sim.span_registered(lo, lo + nbytes):
                continue
            self.live[key] = (StorageWeakRef(storage), nbytes, stream)
            self._take(nbytes, stream)
        self.peak = max(self.peak, self.current)
        cap = self.capacity
        if cap is not None and self.current > cap and not self.over:
            self.over = True  # once: what follows the first would only repeat it
            self.sim.violations.append(
                f"device memory: {self.current} bytes held, more than the device's {cap} "
                f"(a GPU would raise OutOfMemoryError here)"
            )

    def forget(self, lo: int, hi: int) -> None:
        """Host memory in [lo, hi) was registered: the storages there are not the device's."""
        for key, (ref, counted, _) in list(self.live.items()):
            if ref.expired():
                continue
            ptr = torch.UntypedStorage._new_with_weak_ptr(ref.cdata).data_ptr()
            if lo <= ptr and ptr + counted <= hi:
                self.current -= counted  # never device memory: nothing to cache
                del self.live[key]

    def allocated_bytes(self) -> int:
        """Device bytes held now (memory_allocated)."""
        self._sweep()
        return self.current

    def reset_peak(self) -> None:
        """Starts a new peak from what is held now (reset_peak_memory_stats)."""
        self._sweep()
        self.peak = self.current

    def reserved_bytes(self) -> int:
        """Device bytes the caching allocator holds (memory_reserved): what another process
        cannot use."""
        self._sweep()
        return self.reserved

    def empty_cache(self) -> None:
        """The cached blocks go back to the device (torch.cuda.empty_cache)."""
        self._sweep()
        self.cached.clear()
        self.emptied += 1
