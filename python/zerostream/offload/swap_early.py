"""Ranges of a sub-grouped optimizer state updated before its sub-groups, for the update that
runs behind the next forward with offload_optimizer "nvme" (zero/overlap.py).

Note [Persistent ranges first]
  Behind the next forward, the update must write first what the forward reads first: the
  persistent parameters of ZeRO-3 (stage3_param_persistence_threshold), which the forward's
  start gathers all at once. Their shards are small and spread over the whole partition (a
  norm's weight, a bias, in every layer), so over every sub-group: updated in sub-group
  order, the forward's start would wait for the whole update.
  So their ranges are updated first, each on its own: the state of a range on disk is read
  from its extents (a window of a few KiB around it, straight through the store's engine,
  no whole sub-group), stepped into host copies, and its 16-bit values handed on. The
  sub-group pipeline then runs as always, except that a sub-group holding such a range
  takes that range's stepped state from the copies (`fill`, after its read) instead of
  stepping it again, and writes it back with the rest. A range in the host tier is stepped
  in place and passed over later. Nothing is written to disk twice, and the store's
  checksums (written with each whole sub-group) stay true.
  Exact: Adam is elementwise, each element is stepped once, from the same state, gradient,
  factor and hyperparameters as in the serial step, so the same bits (the kernel's result
  does not depend on where a range is cut: zero/sub_groups.h).
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Any, Dict, List, Protocol, Tuple

import torch

from ..aligned import DIRECT_ALIGN, aligned_empty
from . import sinks

if TYPE_CHECKING:
    from .tiered_state import SubGroup

Range = Tuple[int, int]


class PieceReport(Protocol):
    """Told of each piece an update hands on: `before` it is stepped, `done` after its
    16-bit values went to the partition."""

    def before(self, g: int, lo: int, hi: int) -> None: ...

    def done(self, g: int, lo: int, hi: int) -> None: ...


def cuts(sink, lo: int, hi: int, default: int) -> List[Range]:
    """[lo, hi) cut at the sink's hand-off piece (`default` elements where it has none)."""
    step = sinks.piece(sink, default)
    return [(a, min(a + step, hi)) for a in range(lo, hi, step)]


class EarlyRanges:
    """The ranges (group, lo, hi) of `owner`'s partitions stepped before its sub-groups
    (Note [Persistent ranges first]), split where they cross a sub-group's edge."""

    def __init__(self, owner: Any, ranges: List[Tuple[int, int, int]]):
        # owner: the SwappedAdam (offload/optimizer_swap.py, which imports this module)
        self.owner = owner
        self._by_sub: Dict[int, List[Range]] = {}
        self._order: List[Tuple["SubGroup", int, int]] = []
        by_group: Dict[int, List["SubGroup"]] = {}
        for s in owner.sub_groups:
            by_group.setdefault(s.group, []).append(s)
        starts = {g: [s.lo for s in subs] for g, subs in by_group.items()}
        for g, lo, hi in ranges:
            subs = by_group.get(g, [])
            i = max(0, bisect.bisect_right(starts.get(g, []), lo) - 1)
            while lo < hi and i < len(subs):
                s = subs[i]
                a, b = max(lo, s.lo), min(hi, s.hi)
                if a < b:
                    if s.dev is not None:
                        raise ValueError(
                            "optimizer sub-groups on the device are not updated behind the "
                            "next forward"
                        )
                    self._by_sub.setdefault(s.index, []).append((a, b))
                    self._order.append((s, a, b))
                i += 1
        for rs in self._by_sub.values():
            rs.sort()
        # Stepped state of the ranges on disk: sub-group index -> [(lo, hi, [p, m, v])].
        self._stepped: Dict[int, List[Tuple[int, int, List[torch.Tensor]]]] = {}

    def pieces(self, partitions: list) -> List[Tuple[int, int, int]]:
        """The pieces run() hands on, in its order."""
        return [
            (s.group, a, b)
            for s, lo, hi in self._order
            for a, b in cuts(partitions[s.group], lo, hi, hi - lo)
        ]

    def rest(self, s: "SubGroup") -> List[Range]:
        """Sub-group s's elements outside the early ranges, as ranges in order."""
        out, at = [], s.lo
        for a, b in self._by_sub.get(s.index, []):
            if a > at:
                out.append((at, a))
            at = max(at, b)
        if at < s.hi:
            out.append((at, s.hi))
        return out

    def run(self, grads, partitions, grad_scale: float, hyper, report) -> None:
        """Steps every early range, in order; the ranges on disk into host copies."""
        owner, self._stepped = self.owner, {}
        for s, lo, hi in self._order:
            if s.on_disk:
                state = self._window(s, lo, hi)
            else:  # the host tier's, stepped in place
                state = [t[lo - s.lo : hi - s.lo] for t in s.resident()]
            sink = partitions[s.group]
            for a, b in cuts(sink, lo, hi, hi - lo):
                view = [t[a - lo : b - lo] for t in state]
                owner.step_range(
                    s.group,
                    a,
                    b,
                    view,
                    grads[s.group][a:b],
                    sink,
                    grad_scale,
                    hyper[s.group],
                    report,
                    stable=False,
                )
            if s.on_disk:
                self._stepped.setdefault(s.index, []).append((lo, hi, state))

    def fill(self, s: "SubGroup", staged: List[torch.Tensor]) -> None:
        """Sub-group s's early ranges, stepped, into its staged state (just read)."""
        for lo, hi, state in self._stepped.pop(s.index, []):
            for buf, t in zip(staged, state):
                buf[lo - s.lo : hi - s.lo].copy_(t)

    def _window(self, s: "SubGroup", lo: int, hi: int) -> List[torch.Tensor]:
        """The state of elements [lo, hi) of on-disk sub-group s, each kind read from its
        extent in one aligned window (O_DIRECT), as host tensors of hi - lo elements."""
        owner, io = self.owner, self.owner.io
        if io is None:
            raise RuntimeError("EarlyRanges: a sub-group on disk without a swap store's engine")
        out, tickets = [], []
        for k, dtype in enumerate(owner.kind_dtypes):
            path, offset, reserved = owner.disk.extent_of(3 * s.index + k)
            size = dtype.itemsize
            first = (lo - s.lo) * size // DIRECT_ALIGN * DIRECT_ALIGN
            end = min(-(-(hi - s.lo) * size // DIRECT_ALIGN) * DIRECT_ALIGN, reserved)
            buf = aligned_empty(end - first, torch.uint8)
            tickets.append(io.read(buf, path, offset + first))
            skip = (lo - s.lo) * size - first
            out.append(buf[skip : skip + (hi - lo) * size].view(dtype))
            owner.bytes_read += end - first
            owner.window_bytes_read += end - first
        owner._wait(tickets)
        return out
