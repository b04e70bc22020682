"""DeepSpeedCPULion-compatible fused CPU Lion (``from zerostream.ops.lion import
DeepSpeedCPULion``) and its functional kernel call (csrc/optim/lion.h)."""

from __future__ import annotations

from typing import Iterable, Optional, Tuple

import torch

from zerostream import _C
from zerostream.ops._cpu_optimizer import (
    CPUOptimizerBase,
    check_betas,
    check_hyperparams,
    many_buffers,
    run_kwargs,
    step_buffers,
)
from zerostream.ops.threads import optimizer_threads

__all__ = ["DeepSpeedCPULion", "CPULion", "FusedLion", "cpu_lion_step"]


def cpu_lion_step(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    *,
    lr: float,
    betas: Tuple[float, float] = (0.9, 0.99),
    weight_decay: float = 0.0,
    grad_scale: float = 1.0,
    param_copy: Optional[torch.Tensor] = None,
    threads: Optional[int] = None,
    simd: Optional[str] = None,
    nontemporal: str = "auto",
) -> None:
    """One fused Lion step in place (decoupled weight decay)."""
    bufs = step_buffers(param, grad, {"exp_avg": exp_avg}, param_copy)
    beta1, beta2 = check_betas(betas)
    _C.optim.lion_step(
        **bufs,
        lr=float(lr),
        beta1=beta1,
        beta2=beta2,
        weight_decay=float(weight_decay),
        grad_scale=float(grad_scale),
        **run_kwargs(threads, simd, nontemporal),
    )


class DeepSpeedCPULion(CPUOptimizerBase):
    """Drop-in for ``deepspeed.ops.lion.DeepSpeedCPULion``; state: step, exp_avg."""

    _state_names = ("exp_avg",)
    _display_name = "DeepSpeedCPULion"

    def __init__(
        self,
        model_params: Iterable,
        lr: float = 1e-3,
        betas: Tuple[float, float] = (0.9, 0.999),
        weight_decay: float = 0,
        fp32_optimizer_states: bool = True,
        *,
        threads: Optional[int] = None,
        fp32_master_weights: bool = True,
    ):
        check_hyperparams(lr, weight_decay)
        defaults = dict(lr=lr, betas=check_betas(betas), weight_decay=weight_decay)
        super().__init__(
            model_params, defaults, fp32_optimizer_states, threads, fp32_master_weights
        )

    def _group_step(self, group, items, grad_scale) -> None:
        b = many_buffers(items, self._state_names, self._display_name)
        beta1, beta2 = check_betas(group["betas"])
        _C.optim.lion_step_many(
            b["params"],
            b["grads"],
            b["grad_dtypes"],
            b["exp_avg"],
            b["numels"],
            lr=float(group["lr"]),
            beta1=beta1,
            beta2=beta2,
            weight_decay=float(group["weight_decay"]),
            grad_scale=grad_scale,
            param_copies=b["param_copies"],
            copy_dtypes=b["copy_dtypes"],
            param_dtypes=b["param_dtypes"],
            state_dtypes=b["state_dtypes"],
            threads=optimizer_threads(self.threads),
        )


CPULion = DeepSpeedCPULion


class FusedLion(torch.optim.Optimizer):
    """Lion on the params' own device (DeepSpeed's FusedLion, its multi-tensor GPU Lion):
    what `optimizer.type: "Lion"` builds when the optimizer is not offloaded, where the CPU
    kernels cannot reach the masters. The same update as DeepSpeedCPULion (decoupled weight
    decay first, then the sign of the interpolated momentum), in torch's foreach ops, one
    group's tensors at a time; state: exp_avg, in the params' dtype (DeepSpeed's)."""

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: Tuple[float, float] = (0.9, 0.999),
        weight_decay: float = 0.0,
        set_grad_none: bool = True,
    ):
        check_hyperparams(lr, weight_decay)
        defaults = dict(lr=lr, betas=check_betas(betas), weight_decay=weight_decay)
        super().__init__(params, defaults)
        self.set_grad_none = set_grad_none

    def zero_grad(self, set_to_none: Optional[bool] = None) -> None:
        super().zero_grad(set_to_none=self.set_grad_none if set_to_none is None else set_to_none)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            if any(p.grad.is_sparse for p in params):
                raise RuntimeError("FusedLion: sparse gradients are not supported")
            grads = [p.grad for p in params]
            moms = []
            for p in params:
                state = self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                moms.append(state["exp_avg"])
            beta1, beta2 = group["betas"]
            lr, decay = group["lr"], group["weight_decay"]
            if decay != 0:
                torch._foreach_mul_(params, 1 - lr * decay)
            update = torch._foreach_mul(moms, beta1)
            torch._foreach_add_(update, torch._foreach_mul(grads, 1 - beta1))
            torch._foreach_add_(params, torch._foreach_sign(update), alpha=-lr)
            torch._foreach_mul_(moms, beta2)
            torch._foreach_add_(moms, grads, alpha=1 - beta2)
        return loss
