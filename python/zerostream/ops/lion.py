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

__all__ = ["DeepSpeedCPULion", "CPULion", "cpu_lion_step"]


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
