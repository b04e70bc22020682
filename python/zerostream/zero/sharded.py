"""What the partitioned stages (1, 2 and 3) share: each rank holds, per param group, one flat
16-bit (model-dtype) partition it owns, a master copy of it (fp32, or bf16: Note [16-bit
master weights with an offloaded optimizer] in master_precision.py) and a gradient
partition, and steps them with the inner optimizer.

Where that state lives is the offload decision: on the params' device; in the host arena
(page-locked, budgeted) with offload_optimizer "cpu", stepped by the fused CPU kernel with
the unscale/clip factor folded in; in the NVMe swap store with "nvme", streamed through the
kernel sub-group by sub-group (offload/optimizer_swap.py). Stages 1/2 and 3 differ only in
what a group's local partition is (a slice of the flat group, or the concatenated shards of
its parameters) and in how gradients reach the fp32 partition.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Dict, List, Optional

import torch

from ..accelerator import is_host_run, same_device
from ..lazy_tensor import copy_into, materialize
from ..offload import sinks
from ..ops._cpu_optimizer import CPUOptimizerBase
from ..precision import DTYPES
from ..sizing import offloaded_grad_dtype
from .base import ZeroOptimizerBase
from .master_precision import configure_inner, master_dtype, state_bytes
from .protocol import PartitionLayout, StageContext
from .skips import first_non_finite


def _host_grad_dtype(ctx: StageContext, reads_16bit: bool) -> torch.dtype:
    """The dtype of offloaded gradient partitions: the model's 16-bit dtype when nothing
    accumulates in them (gradient_accumulation_steps 1) and the optimizer's kernel reads
    16-bit gradients, so they are downloaded straight into place; fp32 otherwise (Note
    [Gradients to an offloaded partition] in zero/grad_reduce.py)."""
    from ..config import dtype_name

    name = offloaded_grad_dtype(
        ctx.config.precision,
        ctx.config.gradient_accumulation_steps,
        ctx.config.zerostream.offload_gradient_dtype,
        dtype_name(ctx.config.data_types.grad_accum_dtype),
        reads_16bit,
    )
    return DTYPES[name]


def require_host_state(ctx: StageContext, numel: int) -> None:
    """Host-memory preflight (offload/memory_preflight.py) of `numel` elements of optimizer
    state: masters (4 bytes an element, 2 for bf16 ones), gradients (4, or 2 when they land
    16-bit: counted so whenever the config allows it, a lower bound) and Adam's two moments
    (8 more, 4 in bf16, made at the first step) of this rank's partition, times the ranks of
    this host, which allocate the same."""
    from ..offload.memory_preflight import require_state_memory

    offloaded = ctx.config.zero_optimization.offload_optimizer_device != "none"
    grad_width = _host_grad_dtype(ctx, True).itemsize if offloaded else 4
    where = "offload_optimizer cpu" if offloaded else "host memory"
    require_state_memory(
        numel,
        state_bytes(ctx) + grad_width,
        f"the optimizer state in {where}",
        'Set zero_optimization.offload_optimizer.device to "nvme" (with nvme_path) to '
        "keep it on disk, or spread the model over more ranks or nodes.",
        group=ctx.group,
        world=ctx.world,
        device=ctx.device,
    )


class ShardedOptimizerBase(ZeroOptimizerBase):
    """Masters, gradient partitions and the inner optimizer over this rank's local 16-bit
    partitions (`self.local_partitions()`, one tensor per param group)."""

    def _init_state(
        self,
        ctx: StageContext,
        partitions: List[torch.Tensor],
        options: List[dict],
        param_starts: List[List[int]],
        make_optimizer: Optional[Callable],
        make_swapped: Optional[Callable],
        host_partitions: bool = False,
    ) -> None:
        """`make_optimizer(groups)` builds the inner optimizer over the fp32 partitions; with
        offload_optimizer nvme the factory passes `make_swapped(sources, options,
        param_starts)` instead, which builds the fp32 state in the swap store sub-group by
        sub-group from the 16-bit partitions (no whole fp32 copy is ever in memory).
        `host_partitions`: the 16-bit partitions are host memory whatever the compute device
        (stage 3 with offload_param), so the fp32 state next to them is too."""
        zero = ctx.config.zero_optimization
        self.make_placement(ctx)
        self.offload_device = zero.offload_optimizer_device
        self.host_partitions = host_partitions
        self.swapper = None
        # Offloaded (the optimizer, or the parameters at stage 3, which puts the optimizer's
        # state beside them in host memory): gradients go down and updated weights up
        # through the copy stage (offload/copy_stage.py; its CPU twin without a GPU).
        self.copy_stage = None
        self._copy_meter = None  # the copy stage's bytes and seconds into telemetry
        if self.offload_device != "none" or host_partitions:
            from ..offload.copy_stage import CopyMeter, CopyStage
            from ..sizing import copy_slot_bytes

            slot = copy_slot_bytes(max((sinks.numel(p) for p in partitions), default=0))
            pin = (
                zero.offload_optimizer if self.offload_device != "none" else zero.offload_param
            ).pin_memory
            self.copy_stage = CopyStage(ctx.device, slot_bytes=slot, pin=pin)
            self._copy_meter = CopyMeter(self.copy_stage, ctx.telemetry)
        sizes = [sinks.numel(p) for p in partitions]
        if make_swapped is not None:
            # offload_optimizer nvme: the fp32 state lives in the swap store from the start.
            self.swapper = make_swapped(partitions, options, param_starts, self.placement)
            dtype = _host_grad_dtype(ctx, True)
            tier = self.swapper.device_tier
            if tier is not None and ctx.config.zerostream.device_tier_grads == "device":
                # Note [Device-tier gradients stay on the device]: the tier's gradients get
                # device buffers [0, d_g), and the host partitions hold the rest, [d_g, n_g).
                for g, part in tier.make_grad_parts(dtype).items():
                    sizes[g] -= part.numel()
            self.grads = self._allocate_grads(sizes, dtype, zero)
            self.masters, inner = [], self.swapper.hyper
        else:
            if self.offload_device != "none" or host_partitions or is_host_run(ctx.device):
                self._require_host_memory(ctx, sum(sizes))
            self.masters = self._allocate_masters(
                partitions, zero.offload_optimizer, master_dtype(ctx)
            )
            inner = make_optimizer([{**o, "params": [m]} for o, m in zip(options, self.masters)])
            configure_inner(inner, ctx, offloaded=self.offload_device != "none")
            if self.offload_device == "none":
                self.grads = [torch.zeros_like(m) for m in self.masters]
            else:
                reads_16bit = isinstance(inner, CPUOptimizerBase)
                self.grads = self._allocate_grads(sizes, _host_grad_dtype(ctx, reads_16bit), zero)
            if self.grads and self.grads[0].dtype == self.masters[0].dtype:
                for m, gr in zip(self.masters, self.grads):
                    m.grad = gr
            else:  # torch refuses a 16-bit .grad on an fp32 tensor: the kernel is told
                inner.bind_grads(dict(zip(self.masters, self.grads)))
        ZeroOptimizerBase.__init__(self, inner, ctx)
        overlap = ctx.config.zerostream.overlap_step
        if overlap == "next_forward" or (overlap == "backward" and zero.stage == 3):
            from .overlap import make_behind

            self.behind = make_behind(self, ctx)
        if overlap == "backward":
            from .speculate import make_speculation

            self.speculation = make_speculation(self, ctx)

    def offloadable_states(self) -> dict:
        """The tensors of each state kind engine.offload_states may park (Note [Parking state
        in host memory] in zero/state_offload.py). An offloaded optimizer's are host memory
        already (the arena), so parking passes them by; on NVMe they are not tensors here."""
        self.settle_update()
        from .state_offload import OffloadStateType as K
        from .state_offload import StateGroup

        moments = [
            v for st in self.optimizer.state.values() for v in st.values() if torch.is_tensor(v)
        ]
        masters = list(self.masters)
        tier = self.swapper.device_tier if self.swapper is not None else None
        if tier is not None:  # offload_optimizer.ratio's share (Note [The device tier])
            moments += tier.tensors(range(1, 3))
            masters += tier.tensors(range(0, 1))
        return {
            K.optim_states: StateGroup(moments),
            K.hp_params: StateGroup(masters),
            K.lp_grads: StateGroup(list(self.grads) + self._device_grads()),
        }

    # --- gradients of the device tier (offload_optimizer.ratio) ---------------------------------
    def _device_tier(self):
        return self.swapper.device_tier if self.swapper is not None else None

    def _keep_device_tier_grads(self, landing) -> None:
        """The reducer lands the device tier's gradients on the device (Note [Device-tier
        gradients stay on the device] in offload/device_tier.py)."""
        tier = self._device_tier()
        if tier is not None:
            landing.device_parts = tier.grad_parts

    def _device_grads(self) -> List[torch.Tensor]:
        tier = self._device_tier()
        return list(tier.grad_parts.values()) if tier is not None else []

    def _device_grad_part(self, index: int):
        """(the device tier's gradient buffer of group `index` or None, its elements d: the
        partition's boundary between device and host gradients)."""
        tier = self._device_tier()
        part = tier.grad_parts.get(index) if tier is not None else None
        return part, 0 if part is None else part.numel()

    def grad_read(self, index: int, offset: int, n: int) -> torch.Tensor:
        """Elements [offset, offset + n) of group `index`'s gradient partition, wherever they
        landed: a view on one side of the device tier's boundary, an fp32 copy on the device
        across it. (The host partition starts at that boundary: its element i is the
        partition's d + i.)"""
        self.settle_update()
        host = self.grads[index]
        part, d = self._device_grad_part(index)
        if offset >= d:
            return host[offset - d : offset - d + n]
        if offset + n <= d:
            return part[offset : offset + n]
        rest = host[: offset + n - d].to(part.device, torch.float32)
        return torch.cat([part[offset:d].float(), rest])

    def grad_write(self, index: int, offset: int, values: torch.Tensor) -> None:
        """Writes `values` into group `index`'s gradient partition from `offset`, on either
        side of the device tier's boundary."""
        self.settle_update()
        values = values.reshape(-1)
        part, d = self._device_grad_part(index)
        if offset < d:
            m = min(values.numel(), d - offset)
            part[offset : offset + m].copy_(values[:m])
            values, offset = values[m:], offset + m
        if values.numel():
            self.grads[index][offset - d : offset - d + values.numel()].copy_(values)

    def _require_host_memory(self, ctx: StageContext, numel: int) -> None:
        require_host_state(ctx, numel)

    def _allocate_masters(
        self, partitions: List[torch.Tensor], offload, dtype: torch.dtype = torch.float32
    ) -> List[torch.Tensor]:
        """Master partitions of `dtype` (fp32, or bf16: Note [16-bit master weights with an
        offloaded optimizer] in master_precision.py): on the partitions' device, or in the
        host arena when the optimizer is offloaded."""
        partitions = [sinks.values(p) for p in partitions]
        if self.offload_device == "none":
            return [p.detach().to(dtype).clone() for p in partitions]
        from ..offload.host_buffers import HostArena, arena_bytes

        sizes = [p.numel() for p in partitions]
        # Registered: a device partition of the master's dtype uploads straight from it.
        self.arena = HostArena(
            sum(arena_bytes(dtype.itemsize * n) for n in sizes),
            lock=offload.pin_memory,
            register=True,
        )
        masters = []
        for p, n in zip(partitions, sizes):
            m = self.arena.empty(n, dtype)
            m.copy_(p)
            masters.append(m)
        if offload.pin_memory:
            self._track_native_pins(masters)
        return masters

    def _track_native_pins(self, tensors: List[torch.Tensor]) -> None:
        """Under DeepSpeed's native pinning backend (DS_PIN_MEMORY_BACKEND=native) the
        offloaded optimizer's page-locked buffers are the native manager's too, as in
        DeepSpeed: `is_pinned` knows them, and destroy() gives them back (close_state)."""
        from ..offload.locked_tensors import locked_tensors, native_backend

        if native_backend():
            pins = getattr(self, "_native_pins", [])
            pins += [locked_tensors().track(t) for t in tensors]
            self._native_pins = pins

    def _allocate_grads(self, sizes: List[int], dtype: torch.dtype, zero) -> List[torch.Tensor]:
        """Gradient partitions of `dtype` in a host arena of their own (offloaded optimizer;
        Note [Gradients to an offloaded partition] in zero/grad_reduce.py)."""
        from ..offload.host_buffers import HostArena, arena_bytes

        pin = zero.offload_optimizer.pin_memory
        nbytes = sum(arena_bytes(dtype.itemsize * n) for n in sizes)
        self.grad_arena = HostArena(nbytes, lock=pin, register=True)  # downloads land here
        grads = []
        for n in sizes:
            g = self.grad_arena.empty(n, dtype)
            g.zero_()
            grads.append(g)
        if pin:
            self._track_native_pins(grads)
        return grads

    def local_partitions(self) -> List[torch.Tensor]:
        """This rank's 16-bit partition of each group (written after every update)."""
        raise NotImplementedError

    # --- the update ------------------------------------------------------------------------------
    def _average_and_update(self) -> bool:
        """Averages the reduced gradient partitions over ranks, reads the global norm (the
        step's one host read) and, unless it overflowed, updates the partitions with the
        unscale/clip factor. Returns whether the update was applied."""
        # The partitions hold sums over ranks: the average's 1/world (gradient_allreduce_op
        # "mean") is folded into the norm and the factor instead of a pass over them (and a
        # rounding of 16-bit ones).
        # The pieces updated during the backward stop here (zero/speculate.py): step()
        # decides below whether they stand.
        taken = self.speculation.take() if self.speculation is not None else None
        try:
            divisor = self.dp_divisor
            grads = list(self.grads) + self._device_grads()
            norm_sq = self._norm_and_overflow(grads, partitioned=True) / divisor**2
            factor = self._grad_factor(norm_sq)
            if factor is not None:
                self._update(factor / divisor, taken)
            elif taken is not None:  # an overflow: the step is skipped, the speculation undone
                taken.restore(self)
        except BaseException:
            # A failure before the pieces were judged (the norm's collective, a drain): they
            # go back, so the state is the one before this step, as after a serial step
            # that raised there.
            if taken is not None and not taken.consumed:
                taken.restore(self)
            raise
        return factor is not None

    def arm_speculation(self) -> None:
        """At the start of the backward that ends the accumulation (overlap_step "backward"):
        the update's pieces may start as their gradients land, with the factor step() takes
        when nothing clips or overflows (as _grad_factor computes it with a coefficient of 1)
        and the hyperparameters as they stand (Note [The step started during the backward])."""
        pieces = self._behind_pieces(self._sinks(self.local_partitions()))
        scale = self.loss_scaler.loss_scale
        factor = (1.0 / (1.0 * scale)) / self.dp_divisor
        self.speculation.arm(pieces, factor, self.optimizer.param_groups)

    def close_state(self) -> None:
        """Copies in flight read and write host memory that goes with the engine: they finish
        first; then the optimizer state's swap files (offload_optimizer nvme) are deleted."""
        super().close_state()
        if self.speculation is not None:
            self.speculation.close()
        if self.copy_stage is not None:
            self.copy_stage.drain()
        if self.swapper is not None:
            self.swapper.close()
        if getattr(self, "_native_pins", None):
            from ..offload.locked_tensors import locked_tensors

            for t in self._native_pins:
                locked_tensors().forget(t)
            self._native_pins = []

    def _update(self, factor: float, taken=None) -> None:
        """Steps this rank's partitions and writes them into the 16-bit partitions; with the
        copy stage, piece by piece, each piece's upload crossing while the next is stepped.
        With overlap_step, on the update's own thread (zero/overlap.py's launch_update),
        which keeps the pieces `taken` updated during the backward where they stand."""
        if self.copy_stage is not None:
            # The last update's uploads read the host masters (and staging) this one rewrites:
            # after a backward they were drained with its gradients, but a step() with no
            # backward since (a skipped micro-batch) comes straight here.
            self.copy_stage.drain()
        partitions = self._sinks(self.local_partitions())
        if self.behind is not None:
            from .overlap import launch_update

            launch_update(self, partitions, factor, taken)
            return
        if taken is not None and not isinstance(self.optimizer, CPUOptimizerBase):
            taken.restore(self)  # not reached: speculation runs zerostream's CPU kernels only
            taken = None
        try:
            self._update_into(partitions, factor, taken)
        finally:
            if self.copy_stage is not None:
                self.copy_stage.fence()
                self._copy_meter.count()

    def _behind_pieces(self, partitions: list) -> list:
        """The update's pieces (group, lo, hi) in the order it runs them (stage 3 puts the
        persistent params' first: zero/stage3/optimizer.py). Here (stage 2, whose pieces
        only the step started during the backward uses): each partition in order, cut at
        the copy stage's slot and at the overlap's merge size, so that a piece's gradients
        land in a few buckets."""
        from . import overlap

        pieces = []
        for g, part in enumerate(partitions):
            n = sinks.numel(part)
            cap = max(1, min(sinks.piece(part, 1 << 22), overlap.MERGE * 16))
            pieces.extend((g, lo, min(lo + cap, n)) for lo in range(0, n, cap))
        return pieces

    def _update_settled(self) -> None:
        """The update behind the forward ended: the compute stream waits for all of its
        uploads (the forward's gathers waited for their own pieces only)."""
        self.copy_stage.fence()
        self._copy_meter.count()

    def _sinks(self, partitions: list) -> list:
        """The partitions the update writes: one on the compute device is written through
        the copy stage (a DeviceSink); a host one (offload_param cpu) or a stage-3 ShardSink
        as it is."""
        stage = self.copy_stage
        if stage is None or self.host_partitions:
            return partitions
        from ..offload.copy_stage import DeviceSink

        return [
            DeviceSink(p, stage)
            if torch.is_tensor(p) and same_device(p.device, stage.device)
            else p
            for p in partitions
        ]

    def _update_kept(self, partitions: list, factor: float, taken, copy_to) -> None:
        """The serial update after a speculation (zero/speculate.py, stage 2): the pieces it
        updated with this factor and these hyperparameters hand their 16-bit values on, the
        others (their copies put back first) are updated in the kernel's pass."""
        pieces = self._behind_pieces(partitions)
        kept = taken.keep(self, factor, self.optimizer.param_groups, pieces)
        self.speculation.kept_elements += sum(hi - lo for _, lo, hi in kept)

        def done(gi, pi, lo, hi):
            master = self.masters[gi][lo:hi]
            fused = (gi, lo, hi) not in kept
            sinks.hand_on(partitions[gi], lo, hi, master, fused=fused, stable=True)

        work = [(g, 0, lo, hi) for g, lo, hi in pieces]
        with self.telemetry.phase("cpu_update"):
            self.optimizer.step_ranges(
                work, factor, copy_to, done, stepped=lambda gi, pi, lo, hi: (gi, lo, hi) in kept
            )

    @contextlib.contextmanager
    def swapped_step_counted(self):
        """The NVMe optimizer step inside (offload_optimizer nvme, here or on the update's
        thread): its disk bytes and waits go into the step's telemetry."""
        swapper = self.swapper
        before = (swapper.bytes_read, swapper.bytes_written, swapper.wait_seconds)
        start = time.perf_counter()
        yield
        took = time.perf_counter() - start
        self.telemetry.moved("nvme_read", swapper.bytes_read - before[0], took)
        self.telemetry.moved("nvme_write", swapper.bytes_written - before[1], took)
        self.telemetry.add_seconds("swap_wait", swapper.wait_seconds - before[2])

    def _update_into(self, partitions: list, factor: float, taken=None) -> None:
        if self.swapper is not None:
            with self.swapped_step_counted():
                self.swapper.step(self.grads, partitions, factor, self.copy_stage)
            return

        if isinstance(self.optimizer, CPUOptimizerBase) and self.copy_stage is not None:
            # The unscale/clip factor folded into the kernel's one pass, which writes each
            # piece's 16-bit copy straight into the copy stage's staging.
            def copy_to(gi, pi, lo, hi):
                return sinks.fused_target(partitions[gi], lo, hi, self.masters[gi].dtype)

            if taken is not None:  # stage 2: pieces updated during the backward
                self._update_kept(partitions, factor, taken, copy_to)
                return

            def done(gi, pi, lo, hi):
                master = self.masters[gi][lo:hi]
                sinks.hand_on(partitions[gi], lo, hi, master, fused=True, stable=True)

            piece = min((sinks.piece(p) for p in partitions), default=1)
            # The kernel's own time, for `bench step`'s bound on the pipelined step (the
            # slower of this and the lanes' copies); the pieces' hand-offs in `done` count
            # too, being host work the pipeline cannot hide.
            with self.telemetry.phase("cpu_update"):
                self.optimizer.step_in_pieces(piece, factor, copy_to, done)
            return
        if isinstance(self.optimizer, CPUOptimizerBase):
            with self.telemetry.phase("cpu_update"):
                self.optimizer.step(grad_scale=factor)  # folded into the kernel's one pass
        else:
            if factor != 1.0:
                for g in self.grads:
                    g.mul_(factor)
            self.optimizer.step()
        for sink, master in zip(partitions, self.masters):
            step = sinks.piece(sink)
            for lo in range(0, master.numel(), step):
                hi = min(lo + step, master.numel())
                sinks.hand_on(sink, lo, hi, master[lo:hi], fused=False, stable=True)

    def non_finite_state(self) -> Optional[str]:
        """With offload_optimizer nvme the fp32 state is on disk: reading it all back after
        every skip would cost a whole optimizer pass, so the 16-bit partitions, which every
        update rewrites from the fp32 weights (and which NaN moments turn NaN at once), are
        checked in memory and a finding is traced to its sub-group and swap file."""
        self.settle_update()
        if self.swapper is None:
            return super().non_finite_state()
        for g, part in enumerate(self.local_partitions()):
            at = first_non_finite(sinks.values(part))
            if at < 0:
                continue
            s = self.swapper.state_access.sub_group_at(g, at)
            return (
                f"the weights updated from sub-group {s.index} (param group {g}, partition "
                f"elements [{s.lo}, {s.hi}), first inf/NaN at element {at}) hold inf/NaN; its "
                f"fp32 state is in {self.swapper.state_access.location(s)}"
            )
        return None

    def _zero_partition_grads(self) -> None:
        self.reducer.zero()  # Landing.zero: a 16-bit direct landing needs no memset

    @property
    def single_partition_of_fp32_groups(self) -> List[torch.Tensor]:
        return self.masters

    # --- checkpoint state and inspection ---------------------------------------------------------
    def _fp32_partitions(self, streamed: bool = False) -> List[torch.Tensor]:
        """This rank's fp32 master partition of each group (read back from the swap store
        with offload_optimizer nvme, or a source streaming it when `streamed`); the live
        tensors otherwise, as torch's state_dict returns them."""
        self.settle_update()
        if self.swapper is not None:
            read = (
                self.swapper.state_access.state_source
                if streamed
                else self.swapper.state_access.read_state
            )
            return [read(g) for g in range(len(self.grads))]
        return [m.detach() for m in self.masters]

    def _inner_state_dict(self, streamed: bool = False) -> dict:
        """The inner optimizer's state_dict: one "param" per group, its flat partition."""
        self.settle_update()
        if self.swapper is not None:
            return self.swapper.state_access.state_dict(streamed)
        return self.optimizer.state_dict()

    def _layout(self, pieces: list, partition_count) -> PartitionLayout:
        """partition_layout() of a partitioned stage, given its pieces."""
        return PartitionLayout(
            zero_stage=self.stage,
            partitioned=True,
            groups=self.bit16_groups,
            param_groups=self.param_groups,
            loss_scaler=self.loss_scaler.state_dict(),
            fp32_masters=True,
            numels=[sinks.numel(p) for p in self.local_partitions()],
            pieces=pieces,
            partition_count=partition_count,
        )

    def _check_loadable(self, state: dict, stages: tuple) -> None:
        """Raises unless `state` was saved by one of `stages` with this world size."""
        if state.get("zero_stage") not in stages:
            raise ValueError(
                f"optimizer state is from ZeRO stage {state.get('zero_stage')!r}; "
                f"this run is stage {self.stage}"
            )
        saved = state["partition_count"]
        saved = max(saved) if isinstance(saved, list) else saved
        if saved != self.world:
            raise ValueError(
                f"optimizer state was saved by {saved} data-parallel ranks; this run has "
                f"{self.world} (the checkpoint loader reshards it)"
            )

    def _load_partitions(self, saved: List[torch.Tensor], inner: dict) -> None:
        """Restores the fp32 masters (`saved`, one flat partition per group; shorter ones are
        zero padded) and the inner optimizer state, and rewrites the 16-bit partitions.
        Values may be LazyTensors (lazy_tensor.py, a checkpoint's): the masters and, with
        offload_optimizer nvme, the moments are then read from the file straight into the
        host arena or sub-group by sub-group into the swap store, never whole in memory."""
        self.settle_update()
        numels = [sinks.numel(p) for p in self.local_partitions()]
        if len(saved) != len(numels) or any(t.numel() > n for t, n in zip(saved, numels)):
            raise ValueError(
                f"optimizer state partitions have {[t.numel() for t in saved]} elements; "
                f"this model's have {numels}"
            )
        with torch.no_grad():
            if self.swapper is not None:
                parts = self.local_partitions()
                self.swapper.state_access.load_state_dict(
                    inner, saved, then=lambda g, lo, hi, v: sinks.write_piece(parts[g], lo, hi, v)
                )
                return
            for m, t in zip(self.masters, saved):
                copy_into(m[: t.numel()], t)
                m[t.numel() :].zero_()
            if not isinstance(self.optimizer, CPUOptimizerBase):  # it reads LazyTensors itself
                inner = materialize(inner)
            self.optimizer.load_state_dict(inner)
            self._write_partitions(self.masters)

    def _write_partitions(self, fp32: List[torch.Tensor]) -> None:
        """The 16-bit partitions from fp32 values (a stage-3 ShardSink writes to disk)."""
        for part, values in zip(self.local_partitions(), fp32):
            part.copy_(values)

    def refresh_masters(self) -> None:
        """The fp32 masters from the 16-bit weights (a checkpoint loaded without optimizer
        state, as DeepSpeed does); optimizer moments are kept."""
        self.settle_update()
        with torch.no_grad():
            for g, part in enumerate(self.local_partitions()):
                values = sinks.values(part).float()
                if self.swapper is not None:
                    self.swapper.state_access.write_state(g, 0, values)
                else:
                    self.masters[g].copy_(values)

    def _state_numel(self) -> Dict[str, int]:
        """Elements per optimizer state kind held in this process (exp_avg, ...)."""
        kinds: Dict[str, int] = {}
        for st in self.optimizer.state.values():
            for k, t in st.items():
                if torch.is_tensor(t) and t.dim() > 0:
                    kinds[k] = kinds.get(k, 0) + t.numel()
        return kinds

    def _state_summary(self) -> dict:
        """The part of state_summary() every partitioned stage reports."""
        self.settle_update()
        summary = {
            "stage": self.stage,
            "world": self.world,
            "offload": self.offload_device,
            "optimizer": type(self.swapper or self.optimizer).__name__,
            "fp32_master_numel": sum(m.numel() for m in self.masters),
            "optimizer_state_numel": self._state_numel(),
            "fp32_master_device": str(self.masters[0].device) if self.masters else None,
        }
        if self.swapper is not None:
            summary["swap"] = self.swapper.stats()
        return summary
