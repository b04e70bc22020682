"""`deepspeed.runtime.fp16`: DeepSpeed's stage-0 16-bit optimizer wrappers (isinstance views,
see runtime/_wrapper_kind) and the loss scalers (zerostream.precision's)."""

from . import fused_optimizer, loss_scaler, unfused_optimizer

__all__ = ["fused_optimizer", "loss_scaler", "unfused_optimizer"]
