"""The simulated device's memory (Note [The simulated device] in sim_device.py): how many bytes
of device memory the program holds, and their peak, as torch.cuda.memory_allocated and
max_memory_allocated would say on a GPU.

Every storage an op on the device creates counts from that op until the last tensor on it is
gone, the program's or a queued copy's (the sim lets go of a download's device side once the
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
        self.live: Dict[int, Tuple[StorageWeakRef, int]] = {}  # data_ptr -> (storage, bytes)
        self.current = 0
        self.peak = 0

    def _sweep(self) -> None:
        for key in [k for k, (ref, _) in self.live.items() if ref.expired()]:
            self.current -= self.live.pop(key)[1]

    def allocated(self, out) -> None:
        """Counts the storages of an op's outputs that are new device memory."""
        self._sweep()
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            lo, nbytes = storage.data_ptr(), storage.nbytes()
            if nbytes == 0 or lo in self.live or self.sim.span_registered(lo, lo + nbytes):
                continue
            self.live[lo] = (StorageWeakRef(storage), nbytes)
            self.current += nbytes
        self.peak = max(self.peak, self.current)

    def forget(self, lo: int, hi: int) -> None:
        """Host memory in [lo, hi) was registered: the storages there are not the device's."""
        for key in [k for k, (_, n) in self.live.items() if lo <= k and k + n <= hi]:
            self.current -= self.live.pop(key)[1]

    def allocated_bytes(self) -> int:
        """Device bytes held now (memory_allocated)."""
        self._sweep()
        return self.current

    def reset_peak(self) -> None:
        """Starts a new peak from what is held now (reset_peak_memory_stats)."""
        self._sweep()
        self.peak = self.current
