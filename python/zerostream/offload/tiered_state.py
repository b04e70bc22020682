"""A sub-grouped optimizer state's elements wherever each sub-group lives (the device tier,
the host tier or the swap store): reading and writing ranges of it (one parameter's state,
a weight set from outside, a checkpoint being loaded), streaming it to a checkpoint, and its
torch-Adam-shaped state_dict. SwappedAdam (offload/optimizer_swap.py) holds a TieredState;
the step itself stays there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Protocol

import torch

from ..lazy_tensor import LazyTensor
from .device_tier import RATIO_KEY
from .placement import DEVICE, HOST, NVME
from .placement.device import KEY

if TYPE_CHECKING:
    from .device_tier import DeviceTier
    from .swap_store import SwapStore

KINDS = ("param", "exp_avg", "exp_avg_sq")


@dataclass
class SubGroup:
    group: int  # param group index
    lo: int  # element range inside this rank's partition of the group
    hi: int
    index: int  # position in the step order; swap ids are 3 * index + kind
    # The host tier's (param, exp_avg, exp_avg_sq), in place; None: the state is elsewhere.
    host: Optional[List[torch.Tensor]] = field(default=None, repr=False)
    # The device tier's (offload_optimizer.ratio), on the compute device.
    dev: Optional[List[torch.Tensor]] = field(default=None, repr=False)

    @property
    def on_host(self) -> bool:
        return self.host is not None

    def resident(self) -> List[torch.Tensor]:
        """Its (param, exp_avg, exp_avg_sq) where they live in memory: the host tier's, or
        the device tier's; a sub-group on disk has none."""
        state = self.host if self.host is not None else self.dev
        if state is None:
            raise RuntimeError(f"optimizer sub-group {self.index} lives on disk, not in memory")
        return state

    @property
    def on_disk(self) -> bool:
        return self.host is None and self.dev is None

    @property
    def tier(self) -> str:
        return DEVICE if self.dev is not None else HOST if self.on_host else NVME


class StateOwner(Protocol):
    """What TieredState and SwapStateSource read of the sub-grouped optimizer that holds them
    (SwappedAdam, offload/optimizer_swap.py): its sub-groups, dtypes and sizes, its staging
    buffers, its swap store (None without NVMe) and device tier, its step counts and
    hyperparameters; disk reads and writes wait through its `_wait` and count in its
    `bytes_read`/`bytes_written`."""

    sub_groups: List["SubGroup"]
    kind_dtypes: List[torch.dtype]
    dtypes: Dict[str, torch.dtype]
    numels: List[int]
    steps: List[int]
    hyper: torch.optim.Optimizer
    buffers: List[List[torch.Tensor]]
    store: Optional["SwapStore"]
    device_tier: Optional["DeviceTier"]
    uses_disk: bool
    bytes_read: int
    bytes_written: int

    @property
    def disk(self) -> "SwapStore": ...

    def _wait(self, tickets: list) -> None: ...


class SwapStateSource:
    """One group's partition of one state kind, produced sub-group by sub-group from the
    swap store through the swapper's staging buffers (a checkpoint/stream.py source: a
    yielded chunk stays valid until the staging buffers come round again, more than the
    writer's DEPTH chunks later)."""

    def __init__(self, swapper: StateOwner, group: int, kind: str, numel: int = -1):
        self.swapper, self.group, self.kind = swapper, group, KINDS.index(kind)
        numel = swapper.numels[group] if numel < 0 else numel
        self.shape, self.dtype = torch.Size([numel]), swapper.dtypes[kind]

    def __getitem__(self, index: slice) -> "SwapStateSource":
        """`source[:n]`: its first n elements (a partition without its alignment padding)."""
        if not isinstance(index, slice) or index.start or index.step not in (None, 1):
            raise TypeError("a swap state source takes only [:n]")
        n = self.shape[0] if index.stop is None else min(index.stop, self.shape[0])
        return SwapStateSource(self.swapper, self.group, KINDS[self.kind], n)

    def chunks(self):
        sw, end = self.swapper, self.shape[0]
        bufs = [b for triple in sw.buffers for b in triple]
        staged = 0
        for s in (x for x in sw.sub_groups if x.group == self.group):
            if s.lo >= end:
                return
            if s.on_host:  # in place: valid as long as the state is
                yield s.resident()[self.kind][: min(s.hi, end) - s.lo]
                continue
            if s.dev is not None:  # a host copy of its own
                yield s.resident()[self.kind][: min(s.hi, end) - s.lo].to("cpu")
                continue
            buf = bufs[staged % len(bufs)].view(self.dtype)[: s.hi - s.lo]
            staged += 1
            sw._wait([sw.store.read(3 * s.index + self.kind, buf)])
            sw.bytes_read += buf.numel() * buf.element_size()
            yield buf[: min(s.hi, end) - s.lo]


class TieredState:
    """Reads and writes of a SwappedAdam's state (offload/optimizer_swap.py), held by it as
    `state_access`: over its `sub_groups`, `kind_dtypes`/`dtypes`, `numels`, `steps`,
    `hyper`, staging `buffers`, `store` (None without NVMe) and `device_tier`; disk reads
    and writes go through its `_wait` and count in its `bytes_read`/`bytes_written`."""

    def __init__(self, opt: StateOwner):
        self.opt = opt

    def location(self, s: SubGroup) -> str:
        """Where sub-group `s`'s state is, in words (error messages)."""
        tier = self.opt.device_tier
        if s.dev is not None and tier is not None:
            return f"{tier.device} memory (the device tier: {RATIO_KEY} or {KEY})"
        if s.on_host:
            return "host memory (" + (
                "zerostream.optimizer_max_in_cpu)"
                if self.opt.uses_disk
                else 'offload_optimizer "cpu")'
            )
        path, offset, _ = self.opt.disk.extent_of(3 * s.index)
        return f"{path} at offset {offset}"

    def sub_group_at(self, group: int, element: int) -> SubGroup:
        """The sub-group holding `element` of param group `group`'s partition."""
        for s in self.opt.sub_groups:
            if s.group == group and s.lo <= element < s.hi:
                return s
        raise IndexError(f"param group {group} has no element {element} in this partition")

    def write_state(
        self,
        group: int,
        lo: int,
        values: "torch.Tensor | LazyTensor",
        kind: str = "param",
        then=None,
    ) -> None:
        """Overwrites elements [lo, lo + len(values)) of `group`'s `kind` on NVMe (a weight
        changed outside the optimizer, e.g. by GatheredParameters, or a checkpoint being
        loaded), sub-group by sub-group; partly covered sub-groups are read first."""
        k = KINDS.index(kind)
        hi = lo + values.numel()
        dtype = self.opt.kind_dtypes[k]
        buf = self.opt.buffers[0][0].view(dtype)
        for s in self.opt.sub_groups:
            a, b = max(lo, s.lo), min(hi, s.hi)
            if s.group != group or a >= b:
                continue
            n = s.hi - s.lo
            target = buf[:n] if s.on_disk else s.resident()[k]
            if (a, b) != (s.lo, s.hi) and s.on_disk:
                self.opt._wait([self.opt.disk.read(3 * s.index + k, buf[:n])])
                self.opt.bytes_read += dtype.itemsize * n
            piece = target[a - s.lo : b - s.lo]
            if isinstance(values, LazyTensor):  # a checkpoint's FileTensor, piecewise
                if piece.device.type == "cpu":
                    values.read_into(piece, a - lo)
                else:  # read on the host, then up to the device tier
                    host = torch.empty(b - a, dtype=dtype)
                    values.read_into(host, a - lo)
                    piece.copy_(host)
            else:
                piece.copy_(values[a - lo : b - lo])
            if then is not None:  # the whole sub-group's new values, before they go out
                then(group, s.lo, s.hi, target)
            if s.on_disk:
                self.opt._wait([self.opt.disk.write(3 * s.index + k, buf[:n])])
                self.opt.bytes_written += dtype.itemsize * n

    def read_range(self, group: int, lo: int, hi: int, kind: str = "param") -> torch.Tensor:
        """Elements [lo, hi) of group `group`'s partition of `kind`, reading only the
        sub-groups they touch (one parameter's state, zero/param_access.py)."""
        k = KINDS.index(kind)
        dtype = self.opt.kind_dtypes[k]
        out = torch.empty(hi - lo, dtype=dtype)
        buf = self.opt.buffers[0][0].view(dtype)
        for s in self.opt.sub_groups:
            a, b = max(lo, s.lo), min(hi, s.hi)
            if s.group != group or a >= b:
                continue
            if not s.on_disk:
                state = s.resident()
                out[a - lo : b - lo].copy_(state[k][a - s.lo : b - s.lo])
                continue
            self.opt._wait([self.opt.disk.read(3 * s.index + k, buf[: s.hi - s.lo])])
            self.opt.bytes_read += dtype.itemsize * (s.hi - s.lo)
            out[a - lo : b - lo].copy_(buf[a - s.lo : b - s.lo])
        return out

    def read_state(self, group: int, kind: str = "param") -> torch.Tensor:
        """Group `group`'s whole partition of `kind` read back from NVMe (tests, checkpoints)."""
        return self.read_range(group, 0, self.opt.numels[group], kind)

    def state_source(self, group: int, kind: str = "param") -> "SwapStateSource":
        """Group `group`'s partition of `kind` as a source the checkpoint writer streams
        sub-group by sub-group (checkpoint/stream.py), never whole in memory."""
        return SwapStateSource(self.opt, group, kind)

    def state_dict(self, streamed: bool = False) -> dict:
        """The state as torch's Adam lays it out (one "param" per group: its flat
        partition), read back from NVMe (`streamed`: as sources, state_source())."""
        read = self.state_source if streamed else self.read_state
        return {
            "state": {
                g: {
                    "step": self.opt.steps[g],
                    "exp_avg": read(g, "exp_avg"),
                    "exp_avg_sq": read(g, "exp_avg_sq"),
                }
                for g in range(len(self.opt.numels))
                if self.opt.steps[g] > 0
            },
            "param_groups": [
                {**{k: v for k, v in group.items() if k != "params"}, "params": [g]}
                for g, group in enumerate(self.opt.hyper.param_groups)
            ],
        }

    def load_state_dict(self, state: dict, masters: List[torch.Tensor], then=None) -> None:
        """Writes a saved state (state_dict()'s layout, or torch Adam's) and the fp32
        masters back to NVMe, sub-group by sub-group (values may be checkpoint FileTensors,
        read straight from the file; shorter ones are zero padded); groups without saved
        moments restart them at zero. `then(group, lo, hi, values)` sees each sub-group's
        masters as they are written (the caller's 16-bit partitions, without a second read)."""
        saved_groups = state["param_groups"]
        if len(saved_groups) != len(self.opt.numels):
            raise ValueError(
                f"optimizer state has {len(saved_groups)} param groups; this run has "
                f"{len(self.opt.numels)}"
            )
        for g, (group, saved) in enumerate(zip(self.opt.hyper.param_groups, saved_groups)):
            group.update({k: v for k, v in saved.items() if k != "params"})
            st = state["state"].get(saved["params"][0], {})
            self.opt.steps[g] = int(st.get("step", 0))
            for kind, values in (
                ("param", masters[g]),
                ("exp_avg", st.get("exp_avg")),
                ("exp_avg_sq", st.get("exp_avg_sq")),
            ):
                if values is None:
                    values = torch.zeros(self.opt.numels[g], dtype=self.opt.dtypes[kind])
                elif not isinstance(values, LazyTensor):  # (a LazyTensor is cast as read)
                    values = values.to(self.opt.dtypes[kind]).reshape(-1)
                after = then if kind == "param" else None
                self.write_state(g, 0, values, kind, after)
                if values.numel() < self.opt.numels[g]:
                    n = values.numel()
                    zeros = torch.zeros(self.opt.numels[g] - n, dtype=self.opt.dtypes[kind])
                    self.write_state(g, n, zeros, kind, after)
