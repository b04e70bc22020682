"""Stage 0: plain data parallelism. Every rank holds everything; gradients are all-reduced in
buckets of `reduce_bucket_size` elements at the accumulation boundary. With fp16/bf16 the
optimizer steps fp32 master copies and writes the 16-bit params back."""
from __future__ import annotations

import time
from typing import List

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from .. import comm
from .base import ZeroOptimizerBase, _null


class ReplicatedOptimizer(ZeroOptimizerBase):

    def __init__(self, param_groups: List[dict], make_optimizer, *, zero_cfg, loss_scaler,
                 clip: float, prescale_gradients: bool = False,
                 gradient_predivide_factor: float = 1.0, group=None):
        self.world = comm.get_world_size(group)
        self.group = group
        self.reduce_bucket_size = max(1, int(zero_cfg.reduce_bucket_size))
        self.prescale = prescale_gradients
        self.predivide = gradient_predivide_factor
        self.params = [p for g in param_groups for p in g["params"]]
        self.mixed = any(p.dtype != torch.float32 for p in self.params)
        self.masters = None
        inner = param_groups
        if self.mixed:
            self.masters = [p.detach().float().clone() for p in self.params]
            it = iter(self.masters)
            inner = [{**{k: v for k, v in g.items() if k != "params"},
                      "params": [next(it) for _ in g["params"]]} for g in param_groups]
        super().__init__(make_optimizer(inner), loss_scaler, clip, group)

    def after_backward(self) -> None:
        pass

    def reduce_gradients(self) -> None:
        """Bucketed all-reduce with DeepSpeed's pre/post scaling: by default the sum is divided
        by the world size after the reduction; prescale_gradients divides before, and
        gradient_predivide_factor f splits it into 1/f before and f/world after."""
        grads = [p.grad for p in self.params if p.grad is not None]
        if self.world == 1 or not grads:
            return
        pre = 1.0 / self.world if self.prescale else 1.0 / self.predivide
        post = 1.0 if self.prescale else self.predivide / self.world
        bucket: List[torch.Tensor] = []
        size = 0
        for g in grads + [None]:
            if g is not None:
                bucket.append(g)
                size += g.numel()
            if bucket and (g is None or size >= self.reduce_bucket_size):
                flat = _flatten_dense_tensors(bucket)
                if pre != 1.0:
                    flat.mul_(pre)
                start = time.perf_counter()
                comm.all_reduce(flat, group=self.group)
                self._comm(flat, time.perf_counter() - start)
                if post != 1.0:
                    flat.mul_(post)
                for dst, src in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
                    dst.copy_(src)
                bucket, size = [], 0

    def step(self) -> bool:
        with self.telemetry.phase("reduce") if self.telemetry else _null():
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
        for p in self.params:
            p.grad = None
        if self.masters is not None:
            for m in self.masters:
                m.grad = None
