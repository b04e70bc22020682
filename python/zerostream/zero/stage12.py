"""ZeRO stages 1 and 2: fp32 master params and optimizer states partitioned over the
data-parallel ranks; each rank steps its partition; updated params are all-gathered.

Stage 1 accumulates gradients locally in a flat buffer and reduce-scatters it once per
optimizer step. Stage 2 reduces gradients bucket by bucket during backward (as soon as
`reduce_bucket_size` elements are ready) and keeps only this rank's partition, so no rank
holds a full gradient.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import torch

from .. import comm
from .base import ZeroOptimizerBase
from .flat import FlatGroup, ParamSlot


class PartitionedOptimizer(ZeroOptimizerBase):

    def __init__(self, param_groups: List[dict], make_optimizer, *, stage: int, zero_cfg,
                 loss_scaler, clip: float, group=None):
        self.stage = stage
        self.world = comm.get_world_size(group)
        self.rank = comm.get_rank(group)
        self.reduce_bucket_size = max(1, int(zero_cfg.reduce_bucket_size))
        self.overlap_comm = bool(zero_cfg.overlap_comm)
        self.group = group
        self.flat_groups: List[FlatGroup] = []
        self.masters: List[torch.Tensor] = []
        inner_groups = []
        for g in param_groups:
            flat = FlatGroup(g["params"], self.world, self.rank)
            master = flat.partition().detach().float().clone()
            master.grad = torch.zeros_like(master)
            self.flat_groups.append(flat)
            self.masters.append(master)
            inner_groups.append({**{k: v for k, v in g.items() if k != "params"},
                                 "params": [master]})
        super().__init__(make_optimizer(inner_groups), loss_scaler, clip, group)
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
            work = comm.all_reduce(flat, group=self.group, async_op=self.overlap_comm)
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
                self.masters[gi].grad[lo:lo + end - start].add_(flat[pos + start:pos + end])
            pos += slot.numel

    def after_backward(self) -> None:
        """Called by the engine once loss.backward() returned: finish this micro-step's
        reductions (stage 2)."""
        if self.stage == 2:
            self._flush_bucket()
            for work, flat, bucket in self._pending:
                work.wait()
                self._keep_owned(flat, bucket)
            self._pending.clear()

    def reduce_gradients(self) -> None:
        """At the accumulation boundary: stage 1 reduce-scatters its local flat gradients."""
        if self.stage != 1:
            return
        for gi, flat in enumerate(self.flat_groups):
            part = self.masters[gi].grad
            if self.world > 1:
                out = torch.empty(flat.partition_numel, dtype=self.local_grads[gi].dtype)
                comm.reduce_scatter_tensor(out, self.local_grads[gi], group=self.group)
                part.add_(out.float())
            else:
                part.add_(self.local_grads[gi].float())
            self.local_grads[gi].zero_()

    # --- step -------------------------------------------------------------------------------------
    def step(self) -> bool:
        """Averages over ranks, unscales, clips, steps this rank's partition and all-gathers the
        updated params. Returns False (and skips) on overflow."""
        self.reduce_gradients()
        grads = [m.grad for m in self.masters]
        if self.world > 1:
            for g in grads:
                g.div_(self.world)
        ok = self._unscale_and_clip(grads, self._norm_and_overflow(grads, partitioned=True))
        if ok:
            self.optimizer.step()
            for flat, master in zip(self.flat_groups, self.masters):
                flat.partition().copy_(master)
                if self.world > 1:
                    comm.all_gather_into_tensor(flat.buffer, flat.partition(), group=self.group)
        self.zero_grad()
        return ok

    def zero_grad(self, set_to_none: bool = True) -> None:
        for m in self.masters:
            m.grad.zero_()
        for f in self.flat_groups:
            for s in f.slots:
                s.param.grad = None

    @property
    def single_partition_of_fp32_groups(self) -> List[torch.Tensor]:
        return self.masters

    @property
    def bit16_groups(self) -> List[List[torch.nn.Parameter]]:
        return [[s.param for s in f.slots] for f in self.flat_groups]
