"""Mixed-precision bookkeeping: DeepSpeed's static and dynamic loss scalers, the fp16 config
-> scaler factory, the overflow check and the ZeRO unscale-and-clip coefficient.

The dynamic scaler follows DeepSpeed's `runtime/fp16/loss_scaler.py::DynamicLossScaler`
step for step (same counters, same doubling iteration, same exception at the floor), so a
run resumed across the two runtimes keeps the same loss-scale trajectory.

Note [Loss-scaler state machine]
  State: cur_scale, cur_hysteresis, cur_iter, last_overflow_iter. update_scale(overflow):
  * overflow: when delayed_shift == 1 or cur_hysteresis == 1 the scale halves (floored at
    min_scale; already at the floor raises), otherwise cur_hysteresis drops by one. The
    counter is *not* refilled by the halving, so later overflows halve at once until it is.
    last_overflow_iter = cur_iter.
  * clean: consecutive_hysteresis refills cur_hysteresis. With
    stable = cur_iter - last_overflow_iter - 1, the scale doubles when stable > 0 and
    stable % scale_window == 0, refilling cur_hysteresis too.
  * cur_iter += 1 either way.
  The first doubling is therefore on the (scale_window + 1)-th consecutive clean update,
  counted from a fresh scaler or from the last overflow alike.
"""

from __future__ import annotations

import logging
import math
import numbers
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional

import torch

if TYPE_CHECKING:
    from .config import FP16Config

# ds_config's precision names ("precision", "communication_data_type") as torch dtypes.
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
# The 16-bit dtypes a CPU optimizer step also writes a copy of its params in (param_copy)
COPY_DTYPES = (torch.bfloat16, torch.float16)

logger = logging.getLogger("zerostream")

MIN_SCALE_MESSAGE = (
    "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run."
)


class LossScaleAtMinimumError(RuntimeError):
    """An overflow with the dynamic scale already at min_scale: training cannot recover."""


def _positive_finite(value: Any, name: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{name}: expected a finite number > 0; got {value!r}")
    return float(value)


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}: expected an integer > 0; got {value!r}")
    return value


def _is_log_rank() -> bool:
    dist = torch.distributed
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


# --- scalers -----------------------------------------------------------------------------------


class LossScaler:
    """A fixed loss scale. Also the no-op scaler (scale 1) kept for bf16 and fp32, which
    DeepSpeed still creates and saves in checkpoints."""

    dynamic = False

    def __init__(self, scale: float = 1.0):
        self.cur_scale = _positive_finite(scale, "loss_scale")

    @property
    def loss_scale(self) -> float:
        return self.cur_scale

    @property
    def dynamic_loss_scale(self) -> bool:
        """DeepSpeed's LossScaleConfig name for `dynamic`."""
        return self.dynamic

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.cur_scale

    def backward(self, loss: torch.Tensor, retain_graph: bool = False) -> None:
        self.scale_loss(loss).backward(retain_graph=retain_graph)

    def update_scale(self, overflow: bool) -> None:
        """A static scale never changes; an overflowed step is still skipped by the caller."""

    def state_dict(self) -> dict:
        return {"dynamic": False, "cur_scale": self.cur_scale}

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        self.cur_scale = _positive_finite(sd["cur_scale"], "cur_scale")


class DynamicLossScaler(LossScaler):
    """DeepSpeed's dynamic loss scaler; see Note [Loss-scaler state machine]."""

    dynamic = True
    scale_factor = 2.0

    def __init__(
        self,
        init_scale: float = 2.0**16,
        scale_window: int = 1000,
        min_scale: float = 1.0,
        delayed_shift: int = 2,
        consecutive_hysteresis: bool = False,
        raise_error_at_min_scale: bool = True,
    ):
        super().__init__(_positive_finite(init_scale, "init_scale"))
        self.scale_window = _positive_int(scale_window, "scale_window")
        self.min_scale = _positive_finite(min_scale, "min_scale")
        self.delayed_shift = _positive_int(delayed_shift, "delayed_shift")
        self.consecutive_hysteresis = bool(consecutive_hysteresis)
        self.raise_error_at_min_scale = bool(raise_error_at_min_scale)
        self.cur_hysteresis = self.delayed_shift
        self.cur_iter = 0
        self.last_overflow_iter = -1

    def update_scale(self, overflow: bool) -> None:
        if overflow:
            self._on_overflow()
        else:
            self._on_clean()
        self.cur_iter += 1

    def _on_overflow(self) -> None:
        if self.delayed_shift == 1 or self.cur_hysteresis == 1:
            if self.cur_scale == self.min_scale and self.raise_error_at_min_scale:
                raise LossScaleAtMinimumError(MIN_SCALE_MESSAGE)
            next_scale = max(self.cur_scale / self.scale_factor, self.min_scale)
            if _is_log_rank():
                logger.info(
                    "OVERFLOW! Skipping step. Attempted loss scale: %g, reducing to %g",
                    self.cur_scale,
                    next_scale,
                )
            self.cur_scale = next_scale
        else:
            if _is_log_rank():
                logger.info(
                    "OVERFLOW! Skipping step. Attempted loss scale: %g, but hysteresis "
                    "is %d. Reducing hysteresis to %d",
                    self.cur_scale,
                    self.cur_hysteresis,
                    self.cur_hysteresis - 1,
                )
            self.cur_hysteresis -= 1
        self.last_overflow_iter = self.cur_iter

    def _on_clean(self) -> None:
        if self.consecutive_hysteresis:
            self.cur_hysteresis = self.delayed_shift
        stable = self.cur_iter - self.last_overflow_iter - 1
        if stable > 0 and stable % self.scale_window == 0:
            self.cur_hysteresis = self.delayed_shift
            self.cur_scale *= self.scale_factor

    def state_dict(self) -> dict:
        return {
            "dynamic": True,
            "cur_scale": self.cur_scale,
            "cur_iter": self.cur_iter,
            "last_overflow_iter": self.last_overflow_iter,
            "cur_hysteresis": self.cur_hysteresis,
            "scale_window": self.scale_window,
            "min_scale": self.min_scale,
            "delayed_shift": self.delayed_shift,
            "consecutive_hysteresis": self.consecutive_hysteresis,
        }

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        # Only the trajectory is restored; window, floor and hysteresis come from the
        # current config so that a user can change them on resume.
        missing = [
            k
            for k in ("cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis")
            if k not in sd
        ]
        if missing:
            raise ValueError(f"DynamicLossScaler.load_state_dict: missing {missing}")
        self.cur_scale = _positive_finite(sd["cur_scale"], "cur_scale")
        self.cur_iter = int(sd["cur_iter"])
        self.last_overflow_iter = int(sd["last_overflow_iter"])
        self.cur_hysteresis = min(int(sd["cur_hysteresis"]), self.delayed_shift)


# --- fp16 section -> scaler --------------------------------------------------------------------


def make_loss_scaler(fp16: Optional["FP16Config"], stage: int = 1) -> LossScaler:
    """The scaler for the resolved `fp16` section (validated, defaults filled, by the config
    schema). A disabled or absent section (bf16, fp32) gets the no-op LossScaler(1.0).

    Note [The loss scale at stage 0]
      Without ZeRO, DeepSpeed steps fp16 through its FP16_Optimizer (or the unfused one),
      whose scale update is its own: every overflow halves the scale (floored at
      min_loss_scale, without raising there), and `hysteresis` / `consecutive_hysteresis`
      are not read; the doubling rule is the one above. ZeRO stages 1-3 use the
      DynamicLossScaler with hysteresis. zerostream follows both, so a stage-0 run keeps
      DeepSpeed's loss-scale trajectory (its unit test_dynamic_loss_scale.py checks it)."""
    if fp16 is None or not fp16.enabled:
        return LossScaler(1.0)
    if not fp16.dynamic_loss_scale:
        return LossScaler(fp16.loss_scale)
    if stage == 0:
        if fp16.hysteresis != 2 or fp16.consecutive_hysteresis:  # set by the user
            logger.info(
                "fp16.hysteresis (%d) and consecutive_hysteresis apply at ZeRO stages 1-3; at "
                "stage 0 every overflow halves the loss scale, as DeepSpeed's FP16 optimizer "
                "does",
                fp16.hysteresis,
            )
        return DynamicLossScaler(
            init_scale=2.0**fp16.initial_scale_power,
            scale_window=fp16.loss_scale_window,
            min_scale=fp16.min_loss_scale,
            delayed_shift=1,
            raise_error_at_min_scale=False,
        )
    return DynamicLossScaler(
        init_scale=2.0**fp16.initial_scale_power,
        scale_window=fp16.loss_scale_window,
        min_scale=fp16.min_loss_scale,
        delayed_shift=fp16.hysteresis,
        consecutive_hysteresis=fp16.consecutive_hysteresis,
    )


# --- overflow check and clipping ---------------------------------------------------------------


def has_inf_or_nan(tensors: Iterable[Optional[torch.Tensor]]) -> bool:
    """True when any element of any tensor is inf or NaN, with one host sync in all.

    isfinite is exact for every float dtype; a norm- or sum-based check can overflow on large
    finite values (fp16 sums, squared bf16 values), and fused max reductions may drop NaN.
    None entries (absent grads) and non-floating tensors are skipped.
    """
    flags = [
        torch.isfinite(t).all()
        for t in tensors
        if t is not None and (t.is_floating_point() or t.is_complex()) and t.numel() > 0
    ]
    if not flags:
        return False
    # Gather on an accelerator when there is one: host->device copies of the flags queue
    # behind the kernels, while device->host ones would each sync.
    device = next((f.device for f in flags if f.device.type != "cpu"), flags[0].device)
    all_finite = torch.stack([f.to(device) for f in flags]).all()
    return not bool(all_finite.item())


def unscale_and_clip_coef(total_norm: Any, loss_scale: float, clip: float) -> float:
    """DeepSpeed ZeRO's clip coefficient: grads are divided by coef * loss_scale, where
    coef = max(1, (total_norm / loss_scale + 1e-6) / clip) and clip == 0 disables clipping.

    `total_norm` is the norm of the *scaled* grads (float or 0-d tensor; a tensor costs a
    sync). The result equals torch.nn.utils.clip_grad_norm_'s max_norm / (norm + 1e-6) rule.
    """
    scale = _positive_finite(loss_scale, "loss_scale")
    if (
        isinstance(clip, bool)
        or not isinstance(clip, numbers.Real)
        or not math.isfinite(clip)
        or clip < 0
    ):
        raise ValueError(f"gradient_clipping: expected a finite number >= 0; got {clip!r}")
    if clip == 0:
        return 1.0
    norm = float(total_norm.item()) if torch.is_tensor(total_norm) else float(total_norm)
    return max(1.0, (norm / scale + 1e-6) / clip)


def unscale_and_clip_(
    grads: Iterable[torch.Tensor], total_norm: Any, loss_scale: float, clip: float
) -> float:
    """Divides `grads` in place by coef * loss_scale (see unscale_and_clip_coef); returns coef."""
    coef = unscale_and_clip_coef(total_norm, loss_scale, clip)
    grads = [g for g in grads if g is not None]
    if grads:
        torch._foreach_div_(grads, coef * float(loss_scale))
    return coef
