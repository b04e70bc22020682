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
from .base import ZeroOptimizerBase
from .flat import FlatGroup, ParamSlot
from .grad_reduce import Stage1Reducer, Stage2Reducer
from .protocol import StageContext

_REDUCERS = {1: Stage1Reducer, 2: Stage2Reducer}


class PartitionedOptimizer(ZeroOptimizerBase):
    """Stages 1 and 2 (the stage picks the gradient reducer, zero/grad_reduce.py)."""

    def __init__(
        self, ctx: StageContext, param_groups: List[dict], make_optimizer, make_swapped=None
    ):
        """`make_optimizer(groups)` builds the inner optimizer over the fp32 partitions; with
        offload_optimizer nvme the factory passes `make_swapped(masters, options,
        param_starts)` instead, which moves the fp32 state into the swap store."""
        zero = ctx.config.zero_optimization
        self.stage = zero.stage
        self.offload_device = zero.offload_optimizer_device
        self.world, self.rank, self.group = ctx.world, ctx.rank, ctx.group
        self.allgather_bucket_size = zero.allgather_bucket_size
        self.flat_groups = [FlatGroup(g["params"], self.world, self.rank) for g in param_groups]
        options = [{k: v for k, v in g.items() if k != "params"} for g in param_groups]
        self.masters, self.grads = self._allocate_partitions(zero.offload_optimizer)
        self.swapper = None
        if make_swapped is not None:
            # offload_optimizer nvme: the fp32 state lives in the swap store from now on.
            self.swapper = make_swapped(
                self.masters, options, [f.param_starts() for f in self.flat_groups]
            )
            self.masters, inner = [], self.swapper.hyper
        else:
            inner = make_optimizer([{**o, "params": [m]} for o, m in zip(options, self.masters)])
            for m, gr in zip(self.masters, self.grads):
                m.grad = gr
        super().__init__(inner, ctx)
        self.reducer = _REDUCERS[self.stage](self.flat_groups, self.grads, ctx)
        self._slot_of: Dict[torch.nn.Parameter, Tuple[int, ParamSlot]] = {}
        for gi, flat in enumerate(self.flat_groups):
            for slot in flat.slots:
                self._slot_of[slot.param] = (gi, slot)
        self._hooks = [
            s.param.register_post_accumulate_grad_hook(self._on_grad)
            for f in self.flat_groups
            for s in f.slots
        ]

    def _allocate_partitions(self, offload):
        """fp32 master and gradient partitions: on the param's device, or in the host arena
        (page-locked, budgeted) when the optimizer is offloaded."""
        sizes = [f.partition_numel for f in self.flat_groups]
        if self.offload_device == "none":
            masters = [f.partition().detach().float().clone() for f in self.flat_groups]
            return masters, [torch.zeros_like(m) for m in masters]
        from ..offload.io import HostArena, arena_bytes

        self.arena = HostArena(2 * sum(arena_bytes(4 * n) for n in sizes), lock=offload.pin_memory)
        masters, grads = [], []
        for f, n in zip(self.flat_groups, sizes):
            m = self.arena.empty(n, torch.float32)
            m.copy_(f.partition())
            g = self.arena.empty(n, torch.float32)
            g.zero_()
            masters.append(m)
            grads.append(g)
        return masters, grads

    # --- backward --------------------------------------------------------------------------------
    def _on_grad(self, param: torch.nn.Parameter) -> None:
        """Autograd hook: hands the fresh gradient from param.grad to the reducer."""
        gi, slot = self._slot_of[param]
        grad = param.grad.detach().reshape(-1)
        param.grad = None
        self.reducer.on_grad(gi, slot, grad)

    def after_backward(self) -> None:
        self.reducer.after_backward()

    # --- step ------------------------------------------------------------------------------------
    def step(self) -> bool:
        """Averages over ranks, unscales, clips, steps this rank's partition and all-gathers the
        updated params. Returns False (and skips) on overflow."""
        with self.telemetry.phase("reduce"):
            self.reducer.at_boundary()
        if self.world > 1:
            for g in self.grads:
                g.div_(self.world)
        factor = self._grad_factor(self._norm_and_overflow(self.grads, partitioned=True))
        if factor is not None:
            self._update(factor)
            self._publish()
        self.zero_grad()
        return factor is not None

    def _publish(self) -> None:
        """Every rank's copy of every group from the updated partitions."""
        if self.world > 1:
            for flat in self.flat_groups:
                self._all_gather(flat)

    def _all_gather(self, flat: FlatGroup) -> None:
        """Rebuilds every rank's copy of the group from the updated partitions, in pieces of at
        most allgather_bucket_size elements per rank so the staging buffer stays bounded."""
        part = flat.partition_numel
        piece = min(part, self.allgather_bucket_size)
        start = time.perf_counter()
        if piece == part:
            comm.all_gather_into_tensor(flat.buffer, flat.partition(), group=self.group)
        else:
            staging = torch.empty(
                self.world * piece, dtype=flat.buffer.dtype, device=flat.buffer.device
            )
            rows = flat.buffer.view(self.world, part)
            for lo in range(0, part, piece):
                n = min(piece, part - lo)
                out = staging[: self.world * n]
                comm.all_gather_into_tensor(out, flat.partition()[lo : lo + n], group=self.group)
                rows[:, lo : lo + n].copy_(out.view(self.world, n))
        self._comm(flat.buffer, time.perf_counter() - start)

    def _update(self, factor: float) -> None:
        """Steps this rank's partitions and writes them into the model-dtype flat buffers."""
        partitions = [f.partition() for f in self.flat_groups]
        if self.swapper is not None:
            before = (
                self.swapper.bytes_read,
                self.swapper.bytes_written,
                self.swapper.wait_seconds,
            )
            start = time.perf_counter()
            self.swapper.step(self.grads, partitions, factor)
            took = time.perf_counter() - start
            self.telemetry.moved("nvme_read", self.swapper.bytes_read - before[0], took)
            self.telemetry.moved("nvme_write", self.swapper.bytes_written - before[1], took)
            self.telemetry.add_seconds("swap_wait", self.swapper.wait_seconds - before[2])
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

    # --- checkpoint state and inspection ---------------------------------------------------------
    def state_dict(self) -> dict:
        """This rank's optimizer state (DeepSpeed's stage 1/2 key names)."""
        if self.swapper is not None:
            raise NotImplementedError(
                'state_dict of zero_optimization.offload_optimizer.device "nvme": the state '
                "is streamed from the swap store by the checkpoint writer, not gathered here"
            )
        return {
            "zero_stage": self.stage,
            **self._scaler_state(),
            "base_optimizer_state": self.optimizer.state_dict(),
            "single_partition_of_fp32_groups": [m.detach().clone() for m in self.masters],
            "partition_count": self.world,
            "group_paddings": [f.partition_numel - f.partition_valid for f in self.flat_groups],
        }

    def load_state_dict(self, state: dict) -> None:
        if self.swapper is not None:
            self.state_dict()  # raises the same NotImplementedError
        if state.get("zero_stage") not in (1, 2):
            raise ValueError(
                f"optimizer state is from ZeRO stage {state.get('zero_stage')!r}; "
                f"this run is stage {self.stage}"
            )
        if state["partition_count"] != self.world:
            raise NotImplementedError(
                f"optimizer state was saved by {state['partition_count']} data-parallel ranks; "
                f"this run has {self.world} (resharding is done by the checkpoint loader)"
            )
        saved = state["single_partition_of_fp32_groups"]
        if [t.numel() for t in saved] != [m.numel() for m in self.masters]:
            raise ValueError(
                f"optimizer state partitions have {[t.numel() for t in saved]} "
                f"elements; this model's have {[m.numel() for m in self.masters]}"
            )
        self._load_scaler_state(state)
        self.optimizer.load_state_dict(state["base_optimizer_state"])
        with torch.no_grad():
            for m, t, flat in zip(self.masters, saved, self.flat_groups):
                m.copy_(t)
                flat.partition().copy_(m)
        self._publish()

    def _state_numel(self) -> dict:
        """Elements per optimizer state kind held in this process (exp_avg, ...)."""
        kinds: Dict[str, int] = {}
        for st in self.optimizer.state.values():
            for k, t in st.items():
                if torch.is_tensor(t) and t.dim() > 0:
                    kinds[k] = kinds.get(k, 0) + t.numel()
        return kinds

    def state_summary(self) -> dict:
        """Where this rank's state lives and what its reducer did (plain data)."""
        summary = {
            "stage": self.stage,
            "world": self.world,
            "offload": self.offload_device,
            "optimizer": type(self.swapper or self.optimizer).__name__,
            "groups": [
                {
                    "numel": f.numel,
                    "partition_begin": f.partition_begin,
                    "partition_numel": f.partition_numel,
                    "partition_valid": f.partition_valid,
                }
                for f in self.flat_groups
            ],
            "fp32_master_numel": sum(m.numel() for m in self.masters),
            "optimizer_state_numel": self._state_numel(),
            "fp32_master_device": str(self.masters[0].device) if self.masters else None,
            "full_grads_left": sum(
                1 for f in self.flat_groups for s in f.slots if s.param.grad is not None
            ),
            **self.reducer.summary(),
        }
        if self.swapper is not None:
            summary["swap"] = self.swapper.stats()
        return summary
