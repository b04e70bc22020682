"""The simulated device's memory (Note [The simulated device] in sim_device.py): how many bytes
of device memory the program holds, and their peak, as torch.cuda.memory_allocated and
max_memory_allocated would say on a GPU; with a capacity, holding more is reported as a
violation (out of memory), and accelerator.memory_room() answers from it.

Every storage an op on the device creates counts, at its size of the moment (stage 3 frees a
gathered parameter by resizing its storage to nothing), from that op until the last tensor on
it is gone, the program's or a queued copy's (the sim lets go of a download's device side once the
copy ran: record_stream's promise is kept then). Host memory registered with the device
(page-locked arenas, the copy stage's slots) is not device memory and does not count. Frees
are seen at the next op, before its outputs count, so the peak is exact at every allocation,
which is where a peak can happen. Tracking costs a pass over the live storages per op: for
the tests' tiny models only.
"""

from __future__ import annotations

from typing import Dict, Tuple

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._pytree import tree_leaves


class DeviceMemory:
    def __init__(self, sim):
        self.sim = sim
        # The storage's identity (its StorageImpl, which a resize keeps) -> (a weak reference,
        # the bytes counted for it)
        self.live: Dict[int, Tuple[StorageWeakRef, int]] = {}
        self.current = 0
        self.peak = 0
        self.capacity = None  # installed(device_capacity=...): more is out of memory
        self.over = False
        # What the caching allocator keeps from the device: grows with what is held and
        # stays when it is freed (a freed block is cached for the next allocation), until
        # empty_cache() gives the cached blocks back (memory_reserved on a GPU).
        self.reserved = 0
        self.emptied = 0  # empty_cache() calls

    def room(self):
        """accelerator.memory_room()'s answer: (capacity - held, peak - held, capacity)."""
        self._sweep()
        return self.capacity - self.current, self.peak - self.current, self.capacity

    def _sweep(self) -> None:
        """Drops the storages gone and recounts the others at their size now: stage 3 frees
        a gathered parameter by resizing its storage to nothing and gathers into it again."""
        for key, (ref, counted) in list(self.live.items()):
            if ref.expired():
                self.current -= counted
                del self.live[key]
                continue
            now = torch.UntypedStorage._new_with_weak_ptr(ref.cdata).nbytes()
            if now != counted:
                self.current += now - counted
                self.live[key] = (ref, now)

    def allocated(self, out) -> None:
        """Counts the storages of an op's outputs that are new device memory."""
        self._sweep()
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            lo, nbytes = storage.data_ptr(), storage.nbytes()
            key = storage._cdata
            if nbytes == 0 or key in self.live or self.sim.span_registered(lo, lo + nbytes):
                continue
            self.live[key] = (StorageWeakRef(storage), nbytes)
            self.current += nbytes
        self.peak = max(self.peak, self.current)
        self.reserved = max(self.reserved, self.current)
        cap = self.capacity
        if cap is not None and self.current > cap and not self.over:
            self.over = True  # once: what follows the first would only repeat it
            self.sim.violations.append(
                f"device memory: {self.current} bytes held, more than the device's {cap} "
                f"(a GPU would raise OutOfMemoryError here)"
            )

    def forget(self, lo: int, hi: int) -> None:
        """Host memory in [lo, hi) was registered: the storages there are not the device's."""
        for key, (ref, counted) in list(self.live.items()):
            if ref.expired():
                continue
            ptr = torch.UntypedStorage._new_with_weak_ptr(ref.cdata).data_ptr()
            if lo <= ptr and ptr + counted <= hi:
                self.current -= counted
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
        self.reserved = self.current
        self.emptied += 1
