"""`deepspeed.runtime.fp16.fused_optimizer`: FP16_Optimizer, what DeepSpeed builds at ZeRO
stage 0 in 16 bits around FusedAdam (an isinstance view, see runtime/_wrapper_kind)."""

from .._wrapper_kind import WrapperKind


class FP16_Optimizer(metaclass=WrapperKind):  # noqa: N801  (DeepSpeed's name)
    pass


__all__ = ["FP16_Optimizer"]
