"""DeepSpeedCPUAdam-compatible fused CPU Adam/AdamW (``from zerostream.ops.adam import
DeepSpeedCPUAdam``), and the functional kernel call the ZeRO-Offload step uses per sub-group.

The update runs in native code (csrc/optim/adam.h): one pass over memory reading the grad
(fp32, bf16 or fp16), p, m, v and writing p, m, v and an optional bf16/fp16 param copy.
"""

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

__all__ = ["DeepSpeedCPUAdam", "CPUAdam", "cpu_adam_step"]


def cpu_adam_step(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    *,
    lr: float,
    betas: Tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    step: int,
    bias_correction: bool = True,
    adamw_mode: bool = True,
    grad_scale: float = 1.0,
    param_copy: Optional[torch.Tensor] = None,
    threads: Optional[int] = None,
    simd: Optional[str] = None,
    nontemporal: str = "auto",
) -> None:
    """One fused Adam (adamw_mode=False: L2) / AdamW step, in place, over CPU tensors.

    param, exp_avg, exp_avg_sq: contiguous, same numel (any slice of a flat buffer); fp32,
    or a 16-bit param that is its own master with fp32 states or states of its dtype (Note
    [16-bit masters and states] in csrc/optim/step_types.h). grad: fp32, bf16 or fp16,
    multiplied by grad_scale first. param_copy: optional bf16/fp16 buffer that receives the
    updated fp32 params in the same pass. step is 1-based.
    """
    bufs = step_buffers(param, grad, {"exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}, param_copy)
    beta1, beta2 = check_betas(betas)
    _C.optim.adam_step(
        **bufs,
        lr=float(lr),
        beta1=beta1,
        beta2=beta2,
        eps=float(eps),
        weight_decay=float(weight_decay),
        bias_correction=bool(bias_correction),
        adamw_mode=bool(adamw_mode),
        step=int(step),
        grad_scale=float(grad_scale),
        **run_kwargs(threads, simd, nontemporal),
    )


class DeepSpeedCPUAdam(CPUOptimizerBase):
    """Drop-in for ``deepspeed.ops.adam.DeepSpeedCPUAdam``: same constructor, param-group keys
    (lr, betas, eps, weight_decay, bias_correction, amsgrad) and state (step, exp_avg,
    exp_avg_sq). Extensions: ``threads`` (None: zerostream/ops/threads.py's default) and
    ``step(grad_scale=...)``. bf16/fp16 params train against an fp32 master in the state.
    """

    _state_names = ("exp_avg", "exp_avg_sq")
    _display_name = "DeepSpeedCPUAdam"

    def __init__(
        self,
        model_params: Iterable,
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0,
        amsgrad: bool = False,
        adamw_mode: bool = True,
        fp32_optimizer_states: bool = True,
        *,
        threads: Optional[int] = None,
        fp32_master_weights: bool = True,
    ):
        if amsgrad:
            raise NotImplementedError(
                "DeepSpeedCPUAdam: amsgrad=True is not supported "
                "(as in DeepSpeed); use amsgrad=False"
            )
        check_hyperparams(lr, weight_decay, eps)
        defaults = dict(
            lr=lr,
            betas=check_betas(betas),
            eps=eps,
            weight_decay=weight_decay,
            bias_correction=bias_correction,
            amsgrad=amsgrad,
        )
        self.adamw_mode = bool(adamw_mode)
        super().__init__(
            model_params, defaults, fp32_optimizer_states, threads, fp32_master_weights
        )

    def rebuild_kwargs(self) -> dict:
        return {**super().rebuild_kwargs(), "adamw_mode": self.adamw_mode}

    def _check_group(self, group: dict) -> None:
        if group.get("amsgrad", False):
            raise NotImplementedError("DeepSpeedCPUAdam: amsgrad=True is not supported")

    def _group_step(self, group, items, grad_scale) -> None:
        b = many_buffers(items, self._state_names, self._display_name)
        beta1, beta2 = check_betas(group["betas"])
        _C.optim.adam_step_many(
            b["params"],
            b["grads"],
            b["grad_dtypes"],
            b["exp_avg"],
            b["exp_avg_sq"],
            b["numels"],
            [int(it.state["step"]) + 1 for it in items],
            lr=float(group["lr"]),
            beta1=beta1,
            beta2=beta2,
            eps=float(group["eps"]),
            weight_decay=float(group["weight_decay"]),
            bias_correction=bool(group["bias_correction"]),
            adamw_mode=self.adamw_mode,
            grad_scale=grad_scale,
            param_copies=b["param_copies"],
            copy_dtypes=b["copy_dtypes"],
            param_dtypes=b["param_dtypes"],
            state_dtypes=b["state_dtypes"],
            threads=optimizer_threads(self.threads),
        )


# zerostream's own name for the same optimizer.
CPUAdam = DeepSpeedCPUAdam
