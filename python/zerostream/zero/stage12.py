"""ZeRO stages 1 and 2: fp32 master params and optimizer states partitioned over the
data-parallel ranks; each rank steps its partition; updated params are all-gathered.

Optimizer offload: with "cpu" the masters and gradient partitions live in the host arena and
the fused CPU kernel (DeepSpeedCPUAdam) steps them with the unscale/clip factor folded in;
with "nvme" the masters and Adam moments live in the swap store and stream through the
kernel sub-group by sub-group (offload/optimizer_swap.py). DeepSpeed treats "nvme" as "cpu"
at stages 1/2; zerostream honours it.

Stage 1 accumulates gradients locally in a flat buffer and reduce-scatters it once per
optimizer step. Stage 2 reduces gradients bucket by bucket during backward (as soon as
`reduce_bucket_size` elements are ready) and keeps only this rank's partition, so no rank
holds a full gradient.
"""
from __future__ import annotations

import time
from typing import Dict, List, Tuple

import torch

from .. import comm
from ..ops._cpu_optimizer import CPUOptimizerBase
from .base import ZeroOptimizerBase, _null
from .flat import FlatGroup, ParamSlot


class OffloadSpec:
    """Where the optimizer state of a partitioned run lives, and how to build its swapper."""

    def __init__(self, device: str = "none", pin_memory: bool = True, swapper_factory=None):
        self.device = device
        self.pin_memory = pin_memory
        self._swapper_factory = swapper_factory

    def make_swapper(self, masters, options, rank, stage):
        return self._swapper_factory(masters, options, rank, stage)


class PartitionedOptimizer(ZeroOptimizerBase):

    def __init__(self, param_groups: List[dict], make_optimizer, *, stage: int, zero_cfg,
                 loss_scaler, clip: float, group=None, offload: "OffloadSpec" = None):
        self.stage = stage
        self.offload = offload or OffloadSpec()
        self.world = comm.get_world_size(group)
        self.rank = comm.get_rank(group)
        self.reduce_bucket_size = max(1, int(zero_cfg.reduce_bucket_size))
        self.allgather_bucket_size = max(1, int(zero_cfg.allgather_bucket_size))
        self.overlap_comm = bool(zero_cfg.overlap_comm)
        self.group = group
        self.flat_groups = [FlatGroup(g["params"], self.world, self.rank) for g in param_groups]
        options = [{k: v for k, v in g.items() if k != "params"} for g in param_groups]
        self.masters, self.grads = self._allocate_partitions()
        self.swapper = None
        if self.offload.device == "nvme":
            self.swapper = self.offload.make_swapper(self.masters, options, self.rank, stage)
            self.masters = []  # the fp32 state lives on NVMe now
            inner = self.swapper.hyper
        else:
            for m, gr in zip(self.masters, self.grads):
                m.grad = gr
            inner = make_optimizer([{**o, "params": [m]} for o, m in zip(options, self.masters)])
        super().__init__(inner, loss_scaler, clip, group)
        self._slot_of: Dict[torch.nn.Parameter, Tuple[int, ParamSlot]] = {}
        for gi, flat in enumerate(self.flat_groups):
            for slot in flat.slots:
                self._slot_of[slot.param] = (gi, slot)
        if stage == 1:
            self.local_grads = [torch.zeros_like(f.buffer) for f in self.flat_groups]
        self._bucket: List[Tuple[int, ParamSlot, torch.Tensor]] = []
        self._bucket_numel = 0
        self._pending = []  # (work handle, bucket) of async stage-2 reductions
        self._hooks = [s.param.register_post_accumulate_grad_hook(self._on_grad)
                       for f in self.flat_groups for s in f.slots]

    def _allocate_partitions(self):
        """fp32 master and gradient partitions: on the param's device, or in the host arena
        (page-locked, budgeted) when the optimizer is offloaded."""
        sizes = [f.partition_numel for f in self.flat_groups]
        if self.offload.device == "none":
            masters = [f.partition().detach().float().clone() for f in self.flat_groups]
            return masters, [torch.zeros_like(m) for m in masters]
        from ..offload.io import HostArena, arena_bytes
        self.arena = HostArena(2 * sum(arena_bytes(4 * n) for n in sizes),
                               lock=self.offload.pin_memory)
        masters, grads = [], []
        for f, n in zip(self.flat_groups, sizes):
            m = self.arena.empty(n, torch.float32)
            m.copy_(f.partition())
            g = self.arena.empty(n, torch.float32)
            g.zero_()
            masters.append(m)
            grads.append(g)
        return masters, grads

    # --- backward ------------------------------------------------------------------------------
    def _on_grad(self, param: torch.nn.Parameter) -> None:
        """Autograd hook: moves the fresh gradient out of param.grad into ZeRO's buffers."""
        gi, slot = self._slot_of[param]
        grad = param.grad.detach().reshape(-1)
        param.grad = None
        if self.stage == 1:
            self.local_grads[gi][slot.offset:slot.offset + slot.numel].add_(grad)
            return
        self._bucket.append((gi, slot, grad))
        self._bucket_numel += slot.numel
        if self._bucket_numel >= self.reduce_bucket_size:
            self._flush_bucket()

    def _flush_bucket(self) -> None:
        """Sums the bucket's gradients over ranks; each rank keeps what its partition owns.

        Note [Stage-2 bucket reduction]: a bucket holds whole parameters in the order autograd
        finished them, which straddle partition boundaries; one all-reduce of the bucket
        (DeepSpeed's use_multi_rank_bucket_allreduce) then a copy of the owned ranges keeps
        the collective count at one per bucket.
        """
        if not self._bucket:
            return
        bucket, self._bucket, self._bucket_numel = self._bucket, [], 0
        flat = torch.cat([g for _, _, g in bucket]) if len(bucket) > 1 else bucket[0][2].clone()
        if self.world > 1:
            start = time.perf_counter()
            work = comm.all_reduce(flat, group=self.group, async_op=self.overlap_comm)
            self._comm(flat, time.perf_counter() - start)
            if work is not None:
                self._pending.append((work, flat, bucket))
                return
        self._keep_owned(flat, bucket)

    def _keep_owned(self, flat: torch.Tensor, bucket) -> None:
        pos = 0
        for gi, slot, _ in bucket:
            start, end = self.flat_groups[gi].overlap(slot)
            if end > start:
                lo = slot.offset + start - self.flat_groups[gi].partition_begin
                piece = flat[pos + start:pos + end]
                self.grads[gi][lo:lo + end - start].add_(piece.to(self.grads[gi].device))
            pos += slot.numel

    def after_backward(self) -> None:
        """Called by the engine once loss.backward() returned: finish this micro-step's
        reductions (stage 2)."""
        if self.stage == 2:
            self._flush_bucket()
            with self.telemetry.phase("reduce") if self.telemetry else _null():
                for work, flat, bucket in self._pending:
                    work.wait()
                    self._keep_owned(flat, bucket)
            self._pending.clear()

    def reduce_gradients(self) -> None:
        """At the accumulation boundary: stage 1 reduce-scatters its local flat gradients."""
        if self.stage != 1:
            return
        for gi, flat in enumerate(self.flat_groups):
            part = self.grads[gi]
            if self.world > 1:
                out = torch.empty(flat.partition_numel, dtype=self.local_grads[gi].dtype)
                start = time.perf_counter()
                comm.reduce_scatter_tensor(out, self.local_grads[gi], group=self.group)
                self._comm(self.local_grads[gi], time.perf_counter() - start)
                part.add_(out.to(part.device, torch.float32))
            else:
                part.add_(self.local_grads[gi].float())
            self.local_grads[gi].zero_()

    # --- step -------------------------------------------------------------------------------------
    def step(self) -> bool:
        """Averages over ranks, unscales, clips, steps this rank's partition and all-gathers the
        updated params. Returns False (and skips) on overflow."""
        with self.telemetry.phase("reduce") if self.telemetry else _null():
            self.reduce_gradients()
        if self.world > 1:
            for g in self.grads:
                g.div_(self.world)
        factor = self._grad_factor(self._norm_and_overflow(self.grads, partitioned=True))
        if factor is not None:
            self._update(factor)
            if self.world > 1:
                for flat in self.flat_groups:
                    self._all_gather(flat)
        self.zero_grad()
        return factor is not None

    def _all_gather(self, flat: FlatGroup) -> None:
        """Rebuilds every rank's copy of the group from the updated partitions, in pieces of at
        most allgather_bucket_size elements per rank so the staging buffer stays bounded."""
        part = flat.partition_numel
        piece = min(part, self.allgather_bucket_size)
        start = time.perf_counter()
        if piece == part:
            comm.all_gather_into_tensor(flat.buffer, flat.partition(), group=self.group)
        else:
            staging = torch.empty(self.world * piece, dtype=flat.buffer.dtype,
                                  device=flat.buffer.device)
            rows = flat.buffer.view(self.world, part)
            for lo in range(0, part, piece):
                n = min(piece, part - lo)
                out = staging[:self.world * n]
                comm.all_gather_into_tensor(out, flat.partition()[lo:lo + n], group=self.group)
                rows[:, lo:lo + n].copy_(out.view(self.world, n))
        self._comm(flat.buffer, time.perf_counter() - start)

    def _update(self, factor: float) -> None:
        """Steps this rank's partitions and writes them into the model-dtype flat buffers."""
        partitions = [f.partition() for f in self.flat_groups]
        if self.swapper is not None:
            before = (self.swapper.bytes_read, self.swapper.bytes_written,
                      self.swapper.wait_seconds)
            start = time.perf_counter()
            self.swapper.step(self.grads, partitions, factor)
            if self.telemetry is not None:
                took = time.perf_counter() - start
                self.telemetry.moved("nvme_read", self.swapper.bytes_read - before[0], took)
                self.telemetry.moved("nvme_write", self.swapper.bytes_written - before[1], took)
                self.telemetry.seconds["swap_wait"] += self.swapper.wait_seconds - before[2]
            return
        if isinstance(self.optimizer, CPUOptimizerBase):
            self.optimizer.step(grad_scale=factor)  # folded into the kernel's one pass
        else:
            if factor != 1.0:
                for g in self.grads:
                    g.mul_(factor)
            self.optimizer.step()
        for part, master in zip(partitions, self.masters):
            part.copy_(master)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for g in self.grads:
            g.zero_()
        for f in self.flat_groups:
            for s in f.slots:
                s.param.grad = None

    @property
    def single_partition_of_fp32_groups(self) -> List[torch.Tensor]:
        return self.masters

    @property
    def bit16_groups(self) -> List[List[torch.nn.Parameter]]:
        return [[s.param for s in f.slots] for f in self.flat_groups]
