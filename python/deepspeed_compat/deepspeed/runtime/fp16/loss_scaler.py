"""`deepspeed.runtime.fp16.loss_scaler`: the static and dynamic loss scalers (zerostream's,
with DeepSpeed's window, hysteresis and minimum)."""

from zerostream.precision import DynamicLossScaler, LossScaler, has_inf_or_nan

__all__ = ["DynamicLossScaler", "LossScaler", "has_inf_or_nan"]
