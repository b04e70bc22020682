"""DeepSpeedCPUAdagrad-compatible fused CPU Adagrad (``from zerostream.ops.adagrad import
DeepSpeedCPUAdagrad``) and its functional kernel call (csrc/optim/adagrad.h)."""

from __future__ import annotations

from typing import Iterable, Optional

import torch

from zerostream import _C
from zerostream.ops._cpu_optimizer import (
    CPUOptimizerBase,
    StepItem,
    check_hyperparams,
    many_buffers,
    run_kwargs,
    step_buffers,
)
from zerostream.ops.threads import optimizer_threads

__all__ = ["DeepSpeedCPUAdagrad", "CPUAdagrad", "cpu_adagrad_step"]


def cpu_adagrad_step(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    *,
    lr: float,
    eps: float = 1e-10,
    weight_decay: float = 0.0,
    grad_scale: float = 1.0,
    param_copy: Optional[torch.Tensor] = None,
    threads: Optional[int] = None,
    simd: Optional[str] = None,
    nontemporal: str = "auto",
) -> None:
    """One fused Adagrad step in place: exp_avg_sq is the running sum of squared grads."""
    bufs = step_buffers(param, grad, {"sum_sq": exp_avg_sq}, param_copy)
    _C.optim.adagrad_step(
        **bufs,
        lr=float(lr),
        eps=float(eps),
        weight_decay=float(weight_decay),
        grad_scale=float(grad_scale),
        **run_kwargs(threads, simd, nontemporal),
    )


class DeepSpeedCPUAdagrad(CPUOptimizerBase):
    """Drop-in for ``deepspeed.ops.adagrad.DeepSpeedCPUAdagrad``; state: step, exp_avg_sq
    (the sum of squared gradients, DeepSpeed's name for it)."""

    _state_names = ("exp_avg_sq",)
    _display_name = "DeepSpeedCPUAdagrad"
    _sparse_grads = True

    def __init__(
        self,
        model_params: Iterable,
        lr: float = 1e-2,
        eps: float = 1e-10,
        weight_decay: float = 0,
        amsgrad: bool = False,
        fp32_optimizer_states: bool = True,
        *,
        threads: Optional[int] = None,
        fp32_master_weights: bool = True,
    ):
        if amsgrad:
            raise NotImplementedError(
                "DeepSpeedCPUAdagrad: amsgrad=True is not supported "
                "(as in DeepSpeed); use amsgrad=False"
            )
        check_hyperparams(lr, weight_decay, eps)
        defaults = dict(lr=lr, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)
        super().__init__(
            model_params, defaults, fp32_optimizer_states, threads, fp32_master_weights
        )

    def _step_item(self, gi, pi, p, state, master):
        """A sparse gradient (an embedding's with sparse=True, as DeepSpeed's CPU Adagrad
        takes it): the rows it touches are gathered into compact copies of the param (its
        fp32 master, if kept) and of the squared-gradient sum, stepped by the same kernel as
        a dense param, and written back; the other rows and their state stay as they are,
        as torch.optim.Adagrad leaves them."""
        grad = self._grad(p)
        if not grad.is_sparse:
            return super()._step_item(gi, pi, p, state, master)
        grad = grad.coalesce()
        rows = tuple(grad.indices())
        target = p.data if master is None else master
        values = target[rows]  # advanced indexing: compact copies
        compact = {"exp_avg_sq": state["exp_avg_sq"][rows], "step": state["step"]}

        def finish() -> None:
            target[rows] = values
            state["exp_avg_sq"][rows] = compact["exp_avg_sq"]
            if master is not None:
                p.data[rows] = values.to(p.dtype)
            state["step"] += 1

        item = StepItem(values, grad.values().contiguous(), compact, None, gi, pi)
        return item, finish

    def _group_step(self, group, items, grad_scale) -> None:
        b = many_buffers(items, self._state_names, self._display_name)
        _C.optim.adagrad_step_many(
            b["params"],
            b["grads"],
            b["grad_dtypes"],
            b["exp_avg_sq"],
            b["numels"],
            lr=float(group["lr"]),
            eps=float(group["eps"]),
            weight_decay=float(group["weight_decay"]),
            grad_scale=grad_scale,
            param_copies=b["param_copies"],
            copy_dtypes=b["copy_dtypes"],
            param_dtypes=b["param_dtypes"],
            state_dtypes=b["state_dtypes"],
            threads=optimizer_threads(self.threads),
        )


CPUAdagrad = DeepSpeedCPUAdagrad
