"""Optimizer state on NVMe for ZeRO stages 1-3: master params and Adam moments of this rank's
partitions (fp32, or bf16 ones: Note [16-bit master weights with an offloaded optimizer] in
zero/master_precision.py) live in the swap store, cut into sub-groups by
zero/sub_groups.h (`sub_group_size` elements; 0: one per parameter, DeepSpeed's meaning),
and stream through a few host-arena buffers during the step.

Note [Sub-group pipeline]: with pipeline_read the read of sub-group i+1 is in flight while
the fused CPU kernel updates sub-group i; with pipeline_write the write-back of i overlaps
i+1's compute. Buffers rotate over `sets` = max(2, buffer_count // 3) triples (p, m, v), and a
buffer is reused only after its write-back finished, so memory stays at
sets * 3 * sub_group_size * 4 bytes whatever the model size (2 with bf16 masters and moments:
each staging buffer is raw bytes for a sub-group of the widest kind, viewed as a kind's dtype).

Sub-groups in the host tier (zerostream.optimizer_max_in_cpu, Note [Optimizer tiers] in
offload/placement/) keep their three tensors in a host arena and never touch the swap store;
the step updates them in place while the disk reads the next NVMe sub-group. The first
sub-groups may be on the device instead (offload_optimizer.ratio, Note [The device tier] in
offload/device_tier.py), stepped there; with offload_optimizer "cpu" and a ratio the same
class runs with no swap store at all, every other sub-group in the host tier.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Tuple

import torch

from .. import _C, sizing
from ..comm import ranks_on_this_host
from ..ops.adam import adam_hyper, cpu_adam_step
from . import placement, sinks
from .host_buffers import HostArena, arena_bytes
from .io_engine import IoEngine, io_config_for
from .memory_preflight import skewed
from .placement import device as device_placement
from .placement.predict import StepClock, predict_peak_rss
from .swap_early import EarlyRanges, PieceReport, cuts
from .swap_store import SwapStore
from .tiered_state import KINDS, SubGroup, TieredState

if TYPE_CHECKING:
    from ..config import AioConfig, OptimizerConfig, ZeroConfig, ZeroStreamExtConfig

logger = logging.getLogger("zerostream")


class _HyperParams(torch.optim.Optimizer):
    """Holds the param groups' hyperparameters (lr, betas, ...) for LR schedulers and
    checkpoints; the update itself is done by SwappedAdam."""

    def __init__(self, groups: List[dict], defaults: dict):
        placeholders = [{**g, "params": [torch.zeros(0)]} for g in groups]
        super().__init__(placeholders, defaults)

    def step(self, closure=None):
        raise RuntimeError("the optimizer of an NVMe-offloaded run steps through the engine")


class SwappedAdam:
    """Adam/AdamW whose state lives on NVMe (see Note [Sub-group pipeline]). Built from
    its config sections: `optimizer` (hyperparameters, Adam vs AdamW), `zero`
    (sub_group_size, offload_optimizer), `aio` (the I/O engine) and `ext` (zerostream's
    extension keys: swap checksums, CPU threads); `dtypes`: the master's and the moments'
    (fp32, or bf16 ones); `device`: the compute device, home of the device tier (Note [The
    device tier]); `host_preflight(elements)`: checks that the host tier fits, before it is
    allocated; `placer`: the stage's placer (offload/placement/), which places its "auto"
    host tier (it is one of the placer's HostTiers) and agrees every reading across ranks."""

    waiting_for_plan = False  # HostTier: the optimizer never waits for a stage-3 plan

    def __init__(
        self,
        sources: List[torch.Tensor],
        groups: List[dict],
        param_starts: List[List[int]],
        *,
        optimizer: "OptimizerConfig",
        zero: "ZeroConfig",
        aio: "AioConfig",
        ext: "ZeroStreamExtConfig",
        rank: int,
        placer: Optional[placement.Placer] = None,
        dtypes: Tuple[torch.dtype, torch.dtype] = (torch.float32, torch.float32),
        device: Optional[torch.device] = None,
        host_preflight: Optional[Callable[[int], None]] = None,
    ):
        offload = zero.offload_optimizer
        if offload is None:
            raise ValueError("zero_optimization.offload_optimizer: required for a tiered optimizer")
        self.placer = placer if placer is not None else placement.Placer()
        # Reads and writes of ranges of the state wherever it lives (checkpoints, one
        # parameter's state, weights set from outside).
        self.state_access = TieredState(self)
        # comm.agreement over the data-parallel group (Note [Every rank places the same
        # tiers] in offload/placement/); None with one rank.
        self.agree = self.placer.agree
        master, moments = dtypes
        self.dtypes = {"param": master, "exp_avg": moments, "exp_avg_sq": moments}
        self.kind_dtypes = [self.dtypes[k] for k in KINDS]
        self.element_bytes = sum(d.itemsize for d in self.kind_dtypes)
        self.widest = max(d.itemsize for d in self.kind_dtypes)
        self.adamw_mode = optimizer.adamw_mode
        self.threads = ext.cpu_optimizer_threads or None
        self.pipeline_read = offload.pipeline_read
        self.pipeline_write = offload.pipeline_write
        self.hyper = _HyperParams(
            groups, optimizer.kwargs("lr", "betas", "eps", "weight_decay", "bias_correction")
        )
        self.steps = [0] * len(sources)
        self.numels = [sinks.numel(s) for s in sources]
        self.sets = sizing.optimizer_staging_sets(offload.buffer_count)
        self.uses_disk = offload.device == "nvme"
        # Staging only with a disk tier; without one ("cpu" with a ratio) the sub-groups are
        # DeepSpeed's, so the ratio places the same ones.
        sub_group_size = zero.sub_group_size
        if self.uses_disk:
            sub_group_size = self._fit_sub_group_size(sub_group_size, self.sets)
        self.sub_groups: List[SubGroup] = [
            SubGroup(g, lo, hi, i)
            for i, (g, lo, hi) in enumerate(
                _C.plan_sub_groups(self.numels, param_starts, sub_group_size)
            )
        ]
        # The device tier first (Note [The device tier]); the tiers below place the rest.
        # "auto" places it after a measured step (Note [The device tier from a measured step]).
        on_device = ext.optimizer_max_on_device
        home = device if device is not None else torch.device("cpu")
        self.device_auto = device_placement.DevicePlacement(on_device, home, self.agree)
        self.device_tier = device_placement.build(
            self.sub_groups, self.kind_dtypes, home, offload.ratio, on_device
        )
        n_dev = len(self.device_tier.sub_groups) if self.device_tier is not None else 0
        self.offloaded = self.sub_groups[n_dev:]
        sizes = [s.hi - s.lo for s in self.offloaded]
        if self.uses_disk:
            self.tiers = placement.plan(sizes, ext.optimizer_max_in_cpu, self.element_bytes)
        else:  # "cpu": every offloaded sub-group in host memory
            source = 'offload_optimizer "cpu"'
            self.tiers = placement.place(sizes, sum(sizes), source, self.element_bytes)
        # "auto": placed by the placer between two steps, after the parameter shards' own
        # "auto" choice where there is one (Note ["auto" is sized from a measured step]).
        self.placer.attach_optimizer(self, self.uses_disk and ext.optimizer_max_in_cpu == "auto")
        self.clock = StepClock()  # the measured steps (Note [Predicting the placed step])
        self.prediction: Optional[dict] = None  # the host tier's placement's expectations
        self.pin_memory = offload.pin_memory
        on_host = [s for s, t in zip(self.offloaded, self.tiers.tiers) if t == placement.HOST]
        on_disk = [s for s, t in zip(self.offloaded, self.tiers.tiers) if t == placement.NVME]
        # The host tier: each sub-group's three tensors, kept for the whole run.
        self.host_arena = None
        if on_host:
            arena = sum(self._host_bytes(s) for s in on_host)
            if host_preflight is not None:
                host_preflight(sum(s.hi - s.lo for s in on_host))
            self.host_arena = HostArena(
                arena,
                lock=offload.pin_memory,
                register=True,  # a host-tier master uploads straight to a device partition
            )
            for s in on_host:
                s.host = self._host_state(s)
        # Staging for the NVMe tier (and for reading any sub-group back, read_range).
        width = max((s.hi - s.lo for s in on_disk), default=1)
        # Raw bytes, each buffer able to hold a sub-group of any kind (viewed by _staged).
        wide = width * self.widest
        staging = sizing.optimizer_staging_bytes(offload.buffer_count, width, self.widest)
        self.arena = HostArena(staging, lock=offload.pin_memory)
        self.buffers = [
            [self.arena.empty(wide, torch.uint8) for _ in KINDS] for _ in range(self.sets)
        ]
        self.bytes_read = self.bytes_written = 0
        self.window_bytes_read = 0  # of bytes_read: EarlyRanges' windows (swap_early.py)
        self.wait_seconds = 0.0
        self.store = None  # offload_optimizer "cpu" with a ratio: nothing on disk
        self.io: Optional[IoEngine] = None  # the store's engine (EarlyRanges reads through it)
        if not self.uses_disk:
            self._write_initial_state(sources)
            return
        if not offload.nvme_path:
            raise ValueError(
                'zero_optimization.offload_optimizer.nvme_path: required with "device": "nvme"'
            )
        engine = self.io = IoEngine(io_config_for(aio))
        try:
            self.store = SwapStore(
                engine,
                offload.nvme_path,
                rank=rank,
                name="optimizer",
                verify_checksums=ext.verify_swap_checksums,
            )
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"zero_optimization.offload_optimizer.nvme_path: cannot keep "
                f"the optimizer state under {offload.nvme_path!r}: {exc}",
            ) from exc
        if ext.optimizer_max_in_cpu == 0 and not n_dev:
            self._say_if_dram_would_do(sum(self.numels) * self.element_bytes)
        try:
            # Every NVMe sub-group's three extents, before a byte is written.
            self.store.require_space(
                [d.itemsize * (s.hi - s.lo) for s in on_disk for d in self.kind_dtypes],
                "zero_optimization.offload_optimizer.nvme_path",
                sharing=ranks_on_this_host(),
            )
            self._write_initial_state(sources)
        except BaseException:
            self.store.close()  # its files and directory go; the disk is as it was
            raise

    # --- setup -----------------------------------------------------------------------------------
    def _host_bytes(self, s: SubGroup) -> int:
        """Host-arena bytes of a host-tier sub-group's three tensors."""
        return sum(arena_bytes(d.itemsize * (s.hi - s.lo)) for d in self.kind_dtypes)

    def _host_state(self, s: SubGroup) -> List[torch.Tensor]:
        """A host-tier sub-group's (param, exp_avg, exp_avg_sq), from the host arena."""
        arena = self.host_arena
        assert arena is not None, "a host-tier sub-group's arena is made before its state"
        return [arena.empty(s.hi - s.lo, d) for d in self.kind_dtypes]

    def _staged(self, slot: int, n: int) -> List[torch.Tensor]:
        """Staging slot `slot`'s three buffers as n elements of each kind's dtype."""
        return [buf.view(d)[:n] for buf, d in zip(self.buffers[slot], self.kind_dtypes)]

    def _fit_sub_group_size(self, sub_group_size: int, sets: int) -> int:
        """sub_group_size, lowered (one log line) when its staging buffers (sets x 3
        sub-group-sized buffers of the widest kind) would take more than a quarter of the
        free host memory:
        Adam is elementwise, so where the sub-groups are cut changes no result. The reading
        is agreed (the smallest rank's), as every reading that plans the tiers is: the
        sub-groups decide which elements the device tier and each tier hold (Note [Every
        rank places the same tiers] in offload/placement/)."""
        try:
            import psutil

            free = skewed(psutil.virtual_memory().available, "usable")
        except ImportError:
            return sub_group_size
        if self.agree is not None:
            free = int(self.agree([free], "min")[0])
        fits = max(1 << 20, free // 4 // (sets * 3 * self.widest))
        largest = max(self.numels, default=0) if sub_group_size == 0 else sub_group_size
        if largest <= fits:
            return sub_group_size
        logger.warning(
            "zero_optimization.sub_group_size: %d elements need %.1f GiB of staging buffers "
            "with offload_optimizer nvme; free host memory is %.1f GiB, so sub-groups of %d "
            "elements are used",
            largest,
            sets * 3 * self.widest * largest / 2**30,
            free / 2**30,
            fits,
        )
        return fits

    @staticmethod
    def _say_if_dram_would_do(state_bytes: int) -> None:
        try:
            import psutil

            free = psutil.virtual_memory().available
        except ImportError:
            return
        if state_bytes * 2 < free:
            logger.warning(
                'zero_optimization.offload_optimizer.device "nvme": this rank\'s optimizer '
                "state (%.2f GiB) would fit in free host memory (%.1f GiB); "
                '"device": "cpu" keeps it there and is faster (or "zerostream": '
                '{"optimizer_max_in_cpu": "auto"} keeps what fits). Honouring "nvme".',
                state_bytes / 2**30,
                free / 2**30,
            )

    def _write_initial_state(self, sources: List[torch.Tensor]) -> None:
        """Masters (from the 16-bit partitions `sources`) and zero moments, one sub-group
        at a time; a source may be a stage-3 ShardSink whose shards live on NVMe."""
        for buf in self.buffers[0]:
            buf.zero_()
        for s in self.sub_groups:
            n = s.hi - s.lo
            src = sources[s.group]
            values = (
                src[s.lo : s.hi] if isinstance(src, torch.Tensor) else src.read_range(s.lo, s.hi)
            )
            if not s.on_disk:
                state = s.resident()
                state[0].copy_(values)
                state[1].zero_()
                state[2].zero_()
                continue
            staged = self._staged(0, n)
            staged[0].copy_(values)
            tickets = [self.disk.write(3 * s.index + k, buf) for k, buf in enumerate(staged)]
            for t in tickets:
                t.wait()
            self.bytes_written += self.element_bytes * n

    # --- the step --------------------------------------------------------------------------------
    def take_out_of_store(self, s: SubGroup, into: List[torch.Tensor]) -> None:
        """Sub-group `s`'s three kinds read from the swap store into `into` (blocking), and
        its extents freed: its state lives elsewhere from now on (a tier's "auto" move)."""
        self._wait([self.disk.read(3 * s.index + k, t) for k, t in enumerate(into)])
        self.bytes_read += self.element_bytes * (s.hi - s.lo)
        for k in range(len(KINDS)):
            self.disk.free(3 * s.index + k)

    def _read(self, s: SubGroup, slot: int):
        n = s.hi - s.lo
        self.bytes_read += self.element_bytes * n
        return [self.disk.read(3 * s.index + k, buf) for k, buf in enumerate(self._staged(slot, n))]

    @property
    def disk(self) -> SwapStore:
        """The swap store; only sub-groups on disk reach it, and offload_optimizer "cpu" with
        a device tier has none."""
        if self.store is None:
            raise RuntimeError('offload_optimizer "cpu": this optimizer keeps nothing on disk')
        return self.store

    def _wait(self, tickets) -> None:
        start = time.perf_counter()
        for t in tickets:
            t.wait()
        self.wait_seconds += time.perf_counter() - start

    def step(
        self,
        grads: List[torch.Tensor],
        partitions: List[torch.Tensor],
        grad_scale: float,
        stage=None,
    ) -> None:
        """One Adam step of every sub-group: grads[g] is group g's gradient partition (fp32, or
        16-bit where nothing accumulates in it), partitions[g] the model-dtype partition that
        receives the updated params; `stage`, the copy stage, carries the device tier's
        gradients to the device."""
        self.begin_step(grads)
        self.run_step(grads, partitions, grad_scale, stage)

    def begin_step(self, grads: List[torch.Tensor]) -> None:
        """The part of a step that comes before its first sub-group, where every rank is (the
        device tier's and the host tier's "auto" agree their readings across ranks): an
        update run behind the next forward (zero/overlap.py) does this on the caller's
        thread, then run_step on its own."""
        self.clock.begin()
        # The device tier's "auto" before the host tier's: that takes what the device leaves.
        tier = self.device_auto.at_step(
            self.clock.steps,
            [s for s in self.sub_groups if s.dev is None],
            self.kind_dtypes,
            max((g.element_size() for g in grads), default=4),
            self._move_to_device,
        )
        if tier is not None:
            self.device_tier = tier
            self._offloaded_changed()
        if (
            self.placer.pending(self)
            and self.clock.steps >= 1
            and self.placer.optimizer_may_place(self.clock.steps)
        ):
            self._place_host_tier()
        self._clock_counters(self.clock.open)
        for g in range(len(self.steps)):
            self.steps[g] += 1

    def run_step(
        self,
        grads: List[torch.Tensor],
        partitions: List[torch.Tensor],
        grad_scale: float,
        stage=None,
        hyper: Optional[List[dict]] = None,
        early: Optional[EarlyRanges] = None,
        report: Optional[PieceReport] = None,
    ) -> None:
        """Every sub-group's update after begin_step. `hyper`: the param groups'
        hyperparameters as the step found them (the live ones when None); `early`: ranges
        updated first, before any sub-group (Note [Persistent ranges first]); `report`
        hears of each piece before and after it is handed on (update_pieces plans them)."""
        hyper = self.hyper.param_groups if hyper is None else hyper
        if early is not None:
            early.run(grads, partitions, grad_scale, hyper, report)
        # NVMe sub-groups take staging slots in turn (the j-th one slot j % sets); host ones
        # are updated in place between them, while the next NVMe read is in flight.
        disk = [s for s in self.sub_groups if s.on_disk]
        slot_of = {s.index: j % self.sets for j, s in enumerate(disk)}
        pending_reads = {0: self._read(disk[0], 0)} if disk else {}
        pending_writes: Dict[int, list] = {}
        j = 0  # the next NVMe sub-group's position in `disk`
        for s in self.sub_groups:
            dt = self.device_tier
            if s.dev is not None and dt is not None:
                group = hyper[s.group]
                step = self.steps[s.group]
                dt.update(s, grads, partitions, group, step, self.adamw_mode, grad_scale, stage)
                continue
            if s.on_host:
                self._update(s, s.host, grads, partitions, grad_scale, hyper, early, report)
                continue
            slot = slot_of[s.index]
            self._wait(pending_reads.pop(j))
            nxt, j = j + 1, j + 1
            if self.pipeline_read and nxt < len(disk):
                nslot = nxt % self.sets
                self._wait(pending_writes.pop(nslot, []))
                pending_reads[nxt] = self._read(disk[nxt], nslot)
            n = s.hi - s.lo
            staged = self._staged(slot, n)
            if early is not None:
                early.fill(s, staged)
            self._update(s, staged, grads, partitions, grad_scale, hyper, early, report)
            writes = [self.disk.write(3 * s.index + k, buf) for k, buf in enumerate(staged)]
            self.bytes_written += self.element_bytes * n
            if self.pipeline_write:
                pending_writes[slot] = writes
            else:
                self._wait(writes)
            if not self.pipeline_read and nxt < len(disk):
                nslot = nxt % self.sets
                self._wait(pending_writes.pop(nslot, []))
                pending_reads[nxt] = self._read(disk[nxt], nslot)
        for writes in pending_writes.values():
            self._wait(writes)
        if self.device_tier is not None:
            self.device_tier.finish(stage)
        self._clock_counters(self.clock.close)

    def update_pieces(self, partitions: list, early: Optional[EarlyRanges] = None) -> list:
        """The pieces (group, lo, hi) run_step hands on, in its order: `early`'s ranges
        first, then each sub-group's elements outside them, cut at the sink's piece."""
        out = list(early.pieces(partitions)) if early is not None else []
        for s in self.sub_groups:
            sink = partitions[s.group]
            for a, b in early.rest(s) if early is not None else [(s.lo, s.hi)]:
                out.extend((s.group, lo, hi) for lo, hi in cuts(sink, a, b, s.hi - s.lo))
        return out

    def _clock_counters(self, mark) -> None:
        """The step clock's counters now: disk bytes moved by this tier, shard bytes written,
        seconds waited on the disk."""
        mark(
            self.bytes_read + self.bytes_written,
            self.placer.shard_bytes_written(),
            self.wait_seconds,
        )

    def _move_to_device(self, s: SubGroup, on_disk: bool) -> None:
        """Sub-group `s`'s state into its device tensors (s.dev, just allocated by the
        device tier's "auto"), from the swap store through staging slot 0 (its extents
        freed) or from the host tier (its arena bytes stay with the arena). Blocking copies:
        the staging slot is reused for the next one."""
        if on_disk:
            staged = self._staged(0, s.hi - s.lo)
            self.take_out_of_store(s, staged)
            for dev, t in zip(s.resident(), staged):
                dev.copy_(t)
        else:
            host, s.host = s.resident(), None
            for dev, t in zip(s.resident(), host):
                dev.copy_(t)

    def _offloaded_changed(self) -> None:
        """Sub-groups moved to the device ("auto"): the host and NVMe tiers are what is
        left, and unless the host tier's "auto" is still to place (it predicts then), the
        step time expected now is logged."""
        self.offloaded = [s for s in self.sub_groups if s.dev is None]
        host = sum(s.hi - s.lo for s in self.offloaded if s.on_host)
        self.tiers = placement.TierPlan(
            [placement.HOST if s.on_host else placement.NVME for s in self.offloaded],
            host,
            sum(s.hi - s.lo for s in self.offloaded) - host,
            self.tiers.budget_elements,
            self.tiers.source,
            self.element_bytes,
        )
        if self.uses_disk and not self.placer.pending(self):
            self.prediction = p = self._predict()
            logger.info(
                "%s; predicted step %.2f s (forward and backward %.2f s as measured)",
                self.tiers.describe(),
                p["predicted_step_seconds"],
                p["forward_backward_seconds"],
            )

    # --- "auto": the host tier, placed by the placer (a HostTier) ------------------------------
    def disk_bytes(self) -> int:
        """Host-arena bytes of the sub-groups still on disk (what "auto" could move in)."""
        return sum(self._host_bytes(s) for s in self.sub_groups if s.on_disk)

    def last_wait_seconds(self) -> float:
        return self.clock.wait

    def disk_bytes_written(self) -> int:
        return self.bytes_written

    def _place_host_tier(self) -> int:
        """optimizer_max_in_cpu "auto", between two steps: the placer gives the budget and
        the sub-groups that fit move in (move_in); the step time and peak it expects now are
        logged. Returns how many moved."""
        moved_before = sum(1 for s in self.offloaded if s.on_host)
        placed = self.placer.place(self)
        moved = sum(1 for s in self.offloaded if s.on_host) - moved_before
        self.prediction = {
            **self._predict(),
            # No ceiling where nothing could be read (the budget is then 0: all on disk).
            **predict_peak_rss(
                placed.rss_bytes,
                placed.excess_bytes,
                placed.held_bytes,
                None if placed.usable_bytes is None else placed.budget_bytes,
            ),
        }
        p = self.prediction
        logger.info(
            "%s; predicted step %.2f s: forward and backward %.2f s as measured, the optimizer "
            "step %.2f s (the last one took %.2f s moving %.2f GB to and from disk; now %.2f GB)"
            "; predicted peak RSS %s",
            self.tiers.describe(),
            p["predicted_step_seconds"],
            p["forward_backward_seconds"],
            p["predicted_optimizer_step_seconds"],
            p["last_optimizer_step_seconds"],
            p["optimizer_disk_bytes_before"] / 1e9,
            p["optimizer_disk_bytes_after"] / 1e9,
            f"{p['predicted_peak_rss_bytes'] / 2**30:.2f} GiB"
            if "predicted_peak_rss_bytes" in p
            else "unknown (no /proc)",
        )
        return moved

    def move_in(self, budget_bytes: int, source: str) -> int:
        """HostTier: the offloaded sub-groups that fit `budget_bytes` (spread over the step
        order: placement.place) move from the swap store into a new host arena, for good;
        their extents are freed. Returns the arena's bytes."""
        sizes = [s.hi - s.lo for s in self.offloaded]
        plan = placement.place(
            sizes, budget_bytes // self.element_bytes, source, self.element_bytes
        )
        # Each tensor is rounded to the arena's alignment: drop sub-groups (the last in
        # the placement's order) until the arena fits the budget.
        moving = [s for s, t in zip(self.offloaded, plan.tiers) if t == placement.HOST]
        arena = sum(self._host_bytes(s) for s in moving)
        while moving and arena > budget_bytes:
            s = moving.pop()
            arena -= self._host_bytes(s)
        if moving:
            self.host_arena = HostArena(arena, lock=self.pin_memory, register=True)
            for s in moving:
                host = self._host_state(s)
                self.take_out_of_store(s, host)
                s.host = host
        placed = {s.index for s in moving}
        kept = sum(s.hi - s.lo for s in moving)
        self.tiers = placement.TierPlan(
            [placement.HOST if s.index in placed else placement.NVME for s in self.offloaded],
            kept,
            sum(sizes) - kept,
            plan.budget_elements,
            plan.source,
            self.element_bytes,
        )
        return arena

    def _predict(self) -> dict:
        """The placed step's time from the measured one (Note [Predicting the placed step]
        in offload/placement/): called as the tier is placed, at the start of a step()."""
        state = 2 * self.element_bytes * self.tiers.nvme_elements  # read and written back
        return self.clock.predict(state, self.placer.shards_move)

    def _update(
        self,
        s: SubGroup,
        state,
        grads,
        partitions,
        grad_scale: float,
        hyper: Optional[List[dict]] = None,
        early: Optional[EarlyRanges] = None,
        report: Optional[PieceReport] = None,
    ) -> None:
        group = (self.hyper.param_groups if hyper is None else hyper)[s.group]
        # The gradient partition starts past the device tier's gradients, where they land
        # on the device (Note [Device-tier gradients stay on the device]).
        dev = self.device_tier.grad_parts.get(s.group) if self.device_tier else None
        base = 0 if dev is None else dev.numel()
        sink = partitions[s.group]
        # Pieces of one copy-stage slot for a DeviceSink, each crossing to the device while
        # the next is stepped; the whole sub-group otherwise (Note [Partition sinks]). A
        # host-tier master stays until the next step rewrites it; a staging buffer is reused
        # by the next sub-groups, so it is never uploaded from directly.
        for a, b in early.rest(s) if early is not None else [(s.lo, s.hi)]:
            for lo, hi in cuts(sink, a, b, s.hi - s.lo):
                view = [buf[lo - s.lo : hi - s.lo] for buf in state]
                grad = grads[s.group][lo - base : hi - base]
                self.step_range(
                    s.group, lo, hi, view, grad, sink, grad_scale, group, report, stable=s.on_host
                )

    def step_range(
        self, g, lo, hi, state, grad, sink, grad_scale, group, report, stable: bool
    ) -> None:
        """Adam over elements [lo, hi) of group g (`state`: their param, exp_avg and
        exp_avg_sq; `grad`: their gradients), the 16-bit values handed on to `sink`."""
        if report is not None:
            report.before(g, lo, hi)
        p, m, v = state
        target = sinks.fused_target(sink, lo, hi, p.dtype)
        hyper = adam_hyper(group, self.steps[g], self.adamw_mode, grad_scale)
        cpu_adam_step(p, grad, m, v, **hyper, param_copy=target, threads=self.threads)
        sinks.hand_on(sink, lo, hi, p, fused=target is not None, stable=stable)
        if report is not None:
            report.done(g, lo, hi)

    def close(self) -> None:
        """Deletes the optimizer state's swap files (the run is over)."""
        if self.store is not None:
            self.store.close()
        self.placer.withdraw(self)  # no placement follows: the windows stop

    def stats(self) -> dict:
        """Plain data: traffic, the store's directory and every sub-group's extents
        (file, offset, bytes) per kind, so a caller can check the bytes on disk itself."""
        return {
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "wait_seconds": self.wait_seconds,
            "last_step_wait_seconds": self.clock.wait,
            "claimed_first": self.placer.optimizer_goes_first,
            "tier_order_inputs": self.placer.order_inputs,
            "prediction": self.prediction,
            "store": self.store.stats() if self.store is not None else None,
            "directory": self.store.directory if self.store is not None else None,
            "device_elements": self.device_tier.elements if self.device_tier else 0,
            "device_inputs": self.device_auto.inputs,
            "host_elements": self.tiers.host_elements,
            "nvme_elements": self.tiers.nvme_elements,
            "budget_elements": self.tiers.budget_elements,
            "tier_source": self.tiers.source,
            "sub_groups": [
                {
                    "group": s.group,
                    "begin": s.lo,
                    "end": s.hi,
                    "tier": s.tier,
                    **(
                        {k: self.disk.extent_of(3 * s.index + i) for i, k in enumerate(KINDS)}
                        if s.on_disk
                        else {}
                    ),
                }
                for s in self.sub_groups
            ],
        }
