"""What every ZeRO optimizer wrapper shares: the loss scaler, the one-scalar-per-step norm and
overflow check, clipping, and the surface HF Accelerate and LR schedulers touch."""
from __future__ import annotations

import contextlib
import math
from typing import Iterable, List, Optional

import torch

from .. import comm
from ..precision import unscale_and_clip_coef


def _null():
    return contextlib.nullcontext()


class ZeroOptimizerBase:
    """Wraps the inner torch optimizer (`self.optimizer`) the way DeepSpeed's ZeRO optimizers do:
    not a torch.optim.Optimizer itself; `param_groups` proxies the inner one."""

    def __init__(self, optimizer: torch.optim.Optimizer, loss_scaler, clip: float,
                 group=None):
        self.optimizer = optimizer
        self.loss_scaler = loss_scaler
        self.clip = clip
        self.dp_process_group = group
        self.overflow = False
        self._global_grad_norm: Optional[torch.Tensor] = None
        self.telemetry = None  # set by the engine (telemetry.StepTelemetry)
        # Skip the step on inf/nan gradients (fp16 always; bf16 unless
        # bf16.check_grad_overflow is false, as in DeepSpeed; fp32 too: a non-finite update
        # would silently destroy the weights). Set by the engine.
        self.check_overflow = True

    def _comm(self, tensor: torch.Tensor, seconds: float) -> None:
        """Counts a collective's payload for the per-step report."""
        if self.telemetry is not None:
            self.telemetry.moved("comm", tensor.numel() * tensor.element_size(), seconds)

    # --- surface -----------------------------------------------------------------------------
    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    @property
    def loss_scale(self) -> float:
        return self.loss_scaler.loss_scale

    @property
    def cur_scale(self) -> float:
        return self.loss_scaler.loss_scale

    # --- the step's shared arithmetic ------------------------------------------------------------
    def _norm_and_overflow(self, grads: Iterable[torch.Tensor], partitioned: bool) -> float:
        """Squared norm of the still-scaled grads, summed over ranks when each holds a
        partition; inf or nan anywhere makes it non-finite, so one scalar tells both."""
        grads = [g for g in grads if g is not None and g.numel() > 0]
        if grads:
            total = torch.stack([g.float().pow(2).sum() for g in grads]).sum()
        else:
            total = torch.zeros((), dtype=torch.float32)
        if partitioned and comm.get_world_size(self.dp_process_group) > 1:
            comm.all_reduce(total, group=self.dp_process_group)
        return float(total)

    def _grad_factor(self, norm_sq: float) -> Optional[float]:
        """The factor 1/(loss_scale*clip_coef) the grads need, or None on overflow. Records
        the overflow flag and the pre-clip, unscaled global norm."""
        scale = self.loss_scaler.loss_scale
        if not math.isfinite(norm_sq) and self.check_overflow:
            self.overflow = True
            self._global_grad_norm = torch.tensor(float("inf"))
            return None
        self.overflow = False
        norm = math.sqrt(norm_sq)
        self._global_grad_norm = torch.tensor(norm / scale)
        return 1.0 / (unscale_and_clip_coef(norm, scale, self.clip) * scale)

    def _unscale_and_clip(self, grads: List[torch.Tensor], norm_sq: float) -> bool:
        """Applies the factor to `grads` in place; returns False on overflow."""
        factor = self._grad_factor(norm_sq)
        if factor is None:
            return False
        if factor != 1.0:
            for g in grads:
                g.mul_(factor)
        return True
