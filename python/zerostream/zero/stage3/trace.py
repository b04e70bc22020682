"""A step kind's recorded gather sequence and its plan (Note [One gather sequence on every
rank] in coordinator.py): the unit keys the rounds agree on, the trace's events and planned
gathers, and the host staging its reads ahead need."""

from __future__ import annotations

import enum
from typing import List, Optional, Tuple

from ...offload.host_buffers import arena_bytes
from .param import ZeroParam


class TraceMode(enum.Enum):
    RECORD = "record"
    COMPLETE = "complete"
    INVALID = "invalid"


DONE = 1 << 62  # a round's answer from a rank that needs nothing more in this pass
PARAM_KEYS = 1 << 40  # a single parameter's unit: PARAM_KEYS + its ds_id
BUCKET_KEYS = 1 << 41  # a gradient bucket's reduce-scatter: BUCKET_KEYS + its index


class PlannedEvent:
    __slots__ = ("fetch", "prefetch", "release")

    def __init__(self, fetch: List[ZeroParam], prefetch: List[ZeroParam], release):
        self.fetch, self.prefetch, self.release = fetch, prefetch, release


class Trace:
    """One step kind's recorded units and, once complete, its plan (Note [One gather
    sequence on every rank])."""

    def __init__(self, key):
        self.key = key
        self.mode = TraceMode.RECORD
        self.events: List[Tuple[int, Tuple[int, ...]]] = []  # (unit key, ds_ids gathered)
        self.forward_end: Optional[int] = None  # the first backward event
        self.plan: List[PlannedEvent] = []
        self.peak_live = 0
        self.recordings = 0


def peak_read_ahead(trace: "Trace") -> int:
    """The most host staging (whole arena pages) that the plan's reads ahead from the swap
    store hold at once: a prefetch's reads stay in their buffers until an event needs one
    of its params (InflightGather lands them together), so prefetches issued two or more
    events ahead overlap."""
    pending: List[Tuple[set, int]] = []
    peak = 0
    for (_, ids), planned in zip(trace.events, trace.plan):
        needed = set(ids)
        pending = [(group, nbytes) for group, nbytes in pending if not group & needed]
        on_disk = [zp for zp in planned.prefetch if zp.on_nvme]
        if on_disk:
            nbytes = sum(arena_bytes(zp.shard_numel * zp.dtype.itemsize) for zp in on_disk)
            pending.append(({zp.ds_id for zp in planned.prefetch}, nbytes))
        peak = max(peak, sum(nbytes for _, nbytes in pending))
    return peak
