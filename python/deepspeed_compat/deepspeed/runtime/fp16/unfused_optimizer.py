"""`deepspeed.runtime.fp16.unfused_optimizer`: FP16_UnfusedOptimizer, what DeepSpeed builds at
ZeRO stage 0 in 16 bits around any optimizer but FusedAdam (an isinstance view, see
runtime/_wrapper_kind)."""

from .._wrapper_kind import WrapperKind


class FP16_UnfusedOptimizer(metaclass=WrapperKind):  # noqa: N801  (DeepSpeed's name)
    pass


__all__ = ["FP16_UnfusedOptimizer"]
