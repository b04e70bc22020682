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


def adam_hyper(group: dict, step: int, adamw_mode: bool, grad_scale: float) -> dict:
    """cpu_adam_step's (and ops/device_adam.py's device_adam_step's) keyword arguments for a
    param group's hyperparameters at 1-based `step`."""
    return dict(
        lr=group["lr"],
        betas=group["betas"],
        eps=group["eps"],
        weight_decay=group["weight_decay"],
        step=step,
        bias_correction=group.get("bias_correction", True),
        adamw_mode=adamw_mode,
        grad_scale=grad_scale,
    )


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

    @property
    def adam_w_mode(self) -> bool:
        """DeepSpeed's name for adamw_mode (its tests read it)."""
        return self.adamw_mode

    # --- DeepSpeed's speculative steps (SuperOffload): Note [Sub-group steps] ----------------
    # DeepSpeed 0.18's step_subgroup(id) updates every param that has a gradient with the
    # state kept under self.state[id] (one state per sub-group, not per param: the caller
    # puts one sub-group's flat param in the group at a time), and rollback_subgroup(id)
    # undoes the last such step from the same gradient. States are fp32, or the param's
    # dtype with fp32_optimizer_states=False, as DeepSpeed keeps them.
    def _subgroup_items(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.device.type != "cpu":
                    raise ValueError(
                        f"DeepSpeedCPUAdam: param on {p.device}; the CPU optimizer steps host "
                        "tensors (enable offload_optimizer device cpu)"
                    )
                yield group, p

    @torch.no_grad()
    def step_subgroup(self, subgroup_id: int, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group, p in self._subgroup_items():
            state = self.state[subgroup_id]
            if not state:
                dtype = torch.float32 if self.fp32_optimizer_states else p.dtype
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p.data, dtype=dtype)
                state["exp_avg_sq"] = torch.zeros_like(p.data, dtype=dtype)
            state["step"] += 1
            cpu_adam_step(
                p.data,
                p.grad.data,
                state["exp_avg"],
                state["exp_avg_sq"],
                lr=group["lr"],
                betas=group["betas"],
                eps=group["eps"],
                weight_decay=group["weight_decay"],
                step=state["step"],
                bias_correction=group["bias_correction"],
                adamw_mode=self.adamw_mode,
                threads=self.threads,
            )
        return loss

    @torch.no_grad()
    def rollback_subgroup(self, subgroup_id: int, closure=None):
        """Undoes the last step_subgroup(subgroup_id) from the same gradients: the moments
        and the param go back to their values before it (to fp32 rounding), and the step
        count down by one."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        state = self.state[subgroup_id] if subgroup_id in self.state else None
        if not state:
            raise RuntimeError(
                f"DeepSpeedCPUAdam.rollback_subgroup({subgroup_id}): Cannot rollback optimizer "
                f"state for sub_group_id {subgroup_id}: it has none (no step_subgroup ran for it)"
            )
        if state.get("step", 0) <= 0:
            raise RuntimeError(
                f"DeepSpeedCPUAdam.rollback_subgroup({subgroup_id}): Cannot rollback "
                f"sub_group_id {subgroup_id}: step count is {state.get('step', 0)}; nothing to "
                "roll back"
            )
        for group, p in self._subgroup_items():
            _adam_undo(p, state, group, self.adamw_mode)
            state["step"] -= 1
        return loss

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


def _adam_undo(p: torch.Tensor, state: dict, group: dict, adamw_mode: bool) -> None:
    """The inverse of one Adam/AdamW step (update_rules.h's order) at state["step"], in
    fp32: p_before = (p + lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps)) / (1 - lr*wd) (AdamW; L2:
    no division), then the moments from the gradient the step saw (L2: g + wd*p_before)."""
    t = int(state["step"])
    lr, eps, wd = float(group["lr"]), float(group["eps"]), float(group["weight_decay"])
    beta1, beta2 = group["betas"]
    bc1 = 1 - beta1**t if group["bias_correction"] else 1.0
    bc2 = 1 - beta2**t if group["bias_correction"] else 1.0
    m, v = state["exp_avg"].float(), state["exp_avg_sq"].float()
    param = p.data.float() + (lr / bc1) * m / (v.sqrt() / bc2**0.5 + eps)
    if adamw_mode and wd:
        param /= 1 - lr * wd
    g = p.grad.data.float()
    if not adamw_mode and wd:
        g = g + wd * param
    state["exp_avg"].copy_((m - (1 - beta1) * g) / beta1)
    state["exp_avg_sq"].copy_(((v - (1 - beta2) * g * g) / beta2).clamp_(min=0))
    p.data.copy_(param)


# zerostream's own name for the same optimizer.
CPUAdam = DeepSpeedCPUAdam
