"""Stage 0: plain data parallelism. Every rank holds everything; gradients are all-reduced in
buckets of `reduce_bucket_size` elements at the accumulation boundary. With fp16/bf16 the
optimizer steps fp32 master copies and writes the 16-bit params back."""

from __future__ import annotations

import time
from typing import List

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from .. import comm
from ..accelerator import is_host_run
from ..precision import DTYPES
from .base import ZeroOptimizerBase
from .protocol import PartitionLayout, StageContext


class ReplicatedOptimizer(ZeroOptimizerBase):
    def __init__(self, ctx: StageContext, param_groups: List[dict], make_optimizer):
        cfg = ctx.config
        self.world = ctx.world
        self.group = ctx.group
        self.reduce_bucket_size = cfg.zero_optimization.reduce_bucket_size
        self.prescale = cfg.prescale_gradients
        self.predivide = cfg.gradient_predivide_factor
        self.comm_dtype = DTYPES[cfg.communication_data_type]
        self.params = [p for g in param_groups for p in g["params"]]
        self.mixed = any(p.dtype != torch.float32 for p in self.params)
        if is_host_run(ctx.device):
            self._require_host_memory(ctx)
        self.masters = None
        inner = param_groups
        if self.mixed:
            self.masters = [p.detach().float().clone() for p in self.params]
            it = iter(self.masters)
            inner = [
                {
                    **{k: v for k, v in g.items() if k != "params"},
                    "params": [next(it) for _ in g["params"]],
                }
                for g in param_groups
            ]
        self.make_placement(ctx)
        super().__init__(make_optimizer(inner), ctx)
        # Gradients stay on param.grad until the step; the hooks only mark a plain
        # loss.backward()'s gradients as held (Note [A plain loss.backward()] in base.py).
        self._hooks = [
            p.register_post_accumulate_grad_hook(lambda _: self.grad_hook_entered())
            for p in self.params
        ]

    def _require_host_memory(self, ctx: StageContext) -> None:
        """Host-memory preflight (offload/memory_preflight.py) when "device" memory is host
        memory: every rank holds the whole optimizer state, which is Adam's two fp32
        moments (8 bytes an element) plus, in fp16/bf16, the fp32 masters and their
        gradients (8 more), times the ranks of this host."""
        from ..offload.memory_preflight import require_state_memory
        from ..sizing import moment_bytes, optimizer_state_bytes

        # mixed: the fp32 master and moments, and the master's fp32 gradient
        per_element = (
            optimizer_state_bytes(False, False) + 4 if self.mixed else 2 * moment_bytes(False)
        )
        require_state_memory(
            sum(p.numel() for p in self.params),
            per_element,
            "the optimizer state of ZeRO stage 0, whole on every rank",
            "Set zero_optimization.stage to 1, 2 or 3 to partition it over the ranks "
            '(with offload_optimizer "nvme" to keep it on disk), or use fewer ranks per host.',
            group=ctx.group,
            world=ctx.world,
            device=ctx.device,
        )

    # engine.enable_backward_allreduce: False leaves the reduction to the caller. _reduced:
    # engine.allreduce_gradients() averaged the gradients of the backwards so far.
    backward_allreduce = True
    _reduced = False

    @property
    def reduced(self) -> bool:
        return self._reduced

    caller_may_reduce = True  # gradients stay whole on every rank until the step

    def after_backward(self) -> None:
        self._reduced = False  # this backward added gradients the reduction has not seen
        # Note [Stage 0 reduces at the boundary's backward]: DeepSpeed all-reduces at the end
        # of the backward that ends the accumulation (engine.allreduce_gradients), so the
        # bare optimizer initialize() returns in fp32 (as DeepSpeed does) may be stepped
        # directly. A plain loss.backward() (no engine.backward, so no boundary known) and
        # a caller that turned the backward's reduction off keep it for step().
        if self.boundary_backward and self.backward_allreduce and not self.coalescing:
            self.allreduce_now()

    def allreduce_now(self) -> None:
        """engine.allreduce_gradients(): the reduction now instead of at the step; once per
        boundary (the boundary's backward may have reduced already)."""
        if self._reduced:
            return
        with self.telemetry.phase("reduce"):
            self.reduce_gradients()
        self._reduced = True

    def reduce_gradients(self) -> None:
        """Bucketed all-reduce in communication_data_type with DeepSpeed's pre/post scaling:
        by default the sum is divided by the world size after the reduction;
        prescale_gradients divides before, and gradient_predivide_factor f splits it into 1/f
        before and f/world after; gradient_allreduce_op "sum" keeps the sum."""
        if self.world == 1:
            return
        # A param without a gradient on this rank (a branch its batch did not take) is
        # reduced as zeros, as DeepSpeed does: every rank reduces the same buckets, and the
        # average counts the missing gradient as zero (Note [Buckets in one order on every
        # rank] in bucket_order.py says why a per-rank set cannot work).
        for p in self.params:
            if p.grad is None and p.requires_grad:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return
        world = self.dp_divisor  # 1 for "sum"
        pre = 1.0 / world if self.prescale else 1.0 / self.predivide
        post = 1.0 if self.prescale else self.predivide / world
        bucket: List[torch.Tensor] = []
        size = 0
        for g in grads + [None]:
            if g is not None:
                bucket.append(g)
                size += g.numel()
            if bucket and (g is None or size >= self.reduce_bucket_size):
                flat = _flatten_dense_tensors(bucket).to(self.comm_dtype)
                if pre != 1.0:
                    flat.mul_(pre)
                start = time.perf_counter()
                comm.all_reduce(flat, group=self.group)
                self._comm("all_reduce", flat, time.perf_counter() - start)
                if post != 1.0:
                    flat.mul_(post)
                for dst, src in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
                    dst.copy_(src)
                bucket, size = [], 0

    def step(self) -> bool:
        if self.backward_allreduce and not self._reduced:
            with self.telemetry.phase("reduce"):
                self.reduce_gradients()
        if self.mixed:
            for p, m in zip(self.params, self.masters):
                m.grad = None if p.grad is None else p.grad.float()
            grads = [m.grad for m in self.masters if m.grad is not None]
        else:
            grads = [p.grad for p in self.params if p.grad is not None]
        ok = self._unscale_and_clip(grads, self._norm_and_overflow(grads, partitioned=False))
        if ok:
            self.optimizer.step()
            if self.mixed:
                with torch.no_grad():
                    for p, m in zip(self.params, self.masters):
                        p.copy_(m)
        self.zero_grad()
        return ok

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.holding_grads = False
        self._reduced = False
        for p in self.params:
            p.grad = None
        if self.masters is not None:
            for m in self.masters:
                m.grad = None

    # --- checkpoint state -------------------------------------------------------------------------
    def state_dict(self, streamed: bool = False) -> dict:
        state = {
            "zero_stage": 0,
            **self._scaler_state(),
            "base_optimizer_state": self.optimizer.state_dict(),
        }
        if self.masters is not None:
            state["fp32_masters"] = [m.detach().clone() for m in self.masters]
        return state

    def load_state_dict(self, state: dict, publish: bool = True) -> None:
        if state.get("zero_stage") != 0:
            raise ValueError(
                f"optimizer state is from ZeRO stage {state.get('zero_stage')!r}; "
                f"this run is stage 0"
            )
        self._load_scaler_state(state)
        self.optimizer.load_state_dict(state["base_optimizer_state"])
        if self.masters is not None:
            with torch.no_grad():
                for p, m, saved in zip(self.params, self.masters, state["fp32_masters"]):
                    m.copy_(saved)
                    p.copy_(m)

    def publish_loaded(self) -> None:
        """Nothing: every rank loaded whole weights."""

    def partition_layout(self) -> PartitionLayout:
        """Not partitioned: the whole state rides in the model-states file."""
        params = iter(self.params)  # the inner groups hold them (or their masters) in order
        return PartitionLayout(
            zero_stage=0,
            partitioned=False,
            groups=[[next(params) for _ in g["params"]] for g in self.optimizer.param_groups],
            param_groups=self.optimizer.param_groups,
            loss_scaler=self.loss_scaler.state_dict(),
            fp32_masters=self.masters is not None,
        )

    def refresh_masters(self) -> None:
        """The fp32 masters from the weights (a checkpoint loaded without optimizer state)."""
        if self.masters is not None:
            with torch.no_grad():
                for p, m in zip(self.params, self.masters):
                    m.copy_(p)

    def state_summary(self) -> dict:
        return {
            "stage": 0,
            "params": len(self.params),
            "fp32_masters": self.masters is not None,
            "optimizer": type(self.optimizer).__name__,
        }
