"""Flat parameter groups: one contiguous buffer per optimizer param group, params as views.

The layout is DeepSpeed's stage 1/2 layout (reference §1.8): params flattened in group order,
padded to a multiple of 2*world, cut into `world` equal partitions; rank r owns partition r.
`_C.stage12_partition` is the one place that answers which elements a rank owns.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch

from .. import _C
from ..offload.host_buffers import aligned_empty

_INT64_MAX = 2**63 - 1


def _flat_buffer(numel: int, like: torch.Tensor, host_run: bool) -> torch.Tensor:
    """Zeros where `like` lives; on the host 4 KiB aligned, so a checkpoint reads and writes
    the weights straight to and from the disk instead of through the I/O engine's bounce
    buffers. Made from `like` (new_zeros), so the simulated device sees its own memory."""
    if like.device.type == "cpu" and host_run:
        return aligned_empty(numel, like.dtype).zero_()
    return like.new_zeros(numel)


@dataclass(frozen=True)
class ParamSlot:
    param: torch.nn.Parameter
    offset: int  # first element in the flat buffer
    numel: int


class FlatGroup:
    """One param group flattened into `self.buffer` (the model dtype); params become views."""

    def __init__(
        self, params: List[torch.nn.Parameter], world: int, rank: int, host_run: bool = True
    ):
        if not params:
            raise ValueError("a flat group needs at least one parameter")
        dtypes = {p.dtype for p in params}
        devices = {p.device for p in params}
        if len(dtypes) != 1 or len(devices) != 1:
            raise ValueError(
                f"parameters of one group must share dtype and device; got "
                f"{sorted(map(str, dtypes))} on {sorted(map(str, devices))}"
            )
        self.world, self.rank = world, rank
        self.slots: List[ParamSlot] = []
        offset = 0
        for p in params:
            self.slots.append(ParamSlot(p, offset, p.numel()))
            offset += p.numel()
        self.numel = offset
        if self.numel > _INT64_MAX:
            # The sum is a Python int; past int64 the binding would fail with a TypeError about
            # argument types. Bad sizes below that are ValueErrors from zero/shard.cpp.
            raise ValueError(
                f"a flat group of {len(params)} parameters holds {self.numel} elements, more "
                f"than a 64-bit element count ({_INT64_MAX})"
            )
        self.padded_numel = _C.stage12_padded_numel(self.numel, world)
        # Every rank's (begin, numel, valid) from the one native function (zero/shard.h).
        self.ranges = [_C.stage12_partition(self.numel, world, r) for r in range(world)]
        # Asked of the native function, not indexed: ranges[-1] would take the last rank's
        # partition for rank -1 instead of the ValueError naming the rank.
        own = _C.stage12_partition(self.numel, world, rank)
        self.partition_begin, self.partition_numel, self.partition_valid = own
        self._begins = [begin for begin, _, _ in self.ranges]
        self.buffer = _flat_buffer(self.padded_numel, params[0], host_run)
        with torch.no_grad():
            for s in self.slots:
                self.buffer[s.offset : s.offset + s.numel].copy_(s.param.detach().reshape(-1))
                s.param.data = self.buffer[s.offset : s.offset + s.numel].view_as(s.param)

    def partition(self, rank: Optional[int] = None) -> torch.Tensor:
        """View of `rank`'s partition of the buffer (this rank's by default)."""
        begin, numel, _ = self.ranges[self.rank if rank is None else rank]
        return self.buffer[begin : begin + numel]

    def overlap(self, slot: ParamSlot, rank: Optional[int] = None) -> Tuple[int, int]:
        """(start, end) of the slot's elements inside `rank`'s partition (this rank's by
        default), relative to the slot; (0, 0) when that rank owns none of them."""
        begin, numel, _ = self.ranges[self.rank if rank is None else rank]
        lo = max(slot.offset, begin)
        hi = min(slot.offset + slot.numel, begin + numel)
        if hi <= lo:
            return 0, 0
        return lo - slot.offset, hi - slot.offset

    def owners(self, slot: ParamSlot) -> range:
        """The ranks owning some of the slot's elements: partitions are consecutive ranges in
        rank order, so they form one run, found by bisecting the partition starts."""
        first = bisect.bisect_right(self._begins, slot.offset) - 1
        last = bisect.bisect_right(self._begins, slot.offset + max(slot.numel, 1) - 1) - 1
        return range(first, last + 1)

    def param_starts(self) -> List[int]:
        """Offsets inside this rank's partition where a parameter's owned piece begins."""
        starts = []
        for slot in self.slots:
            start, end = self.overlap(slot)
            if end > start:
                starts.append(slot.offset + start - self.partition_begin)
        return starts
