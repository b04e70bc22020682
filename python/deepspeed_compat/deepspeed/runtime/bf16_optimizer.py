"""`deepspeed.runtime.bf16_optimizer`: BF16_Optimizer, for isinstance checks (see
_wrapper_kind: ZeRO stage 1 in bf16 with fp32 gradient accumulation)."""

from ._wrapper_kind import WrapperKind


class BF16_Optimizer(metaclass=WrapperKind):  # noqa: N801  (DeepSpeed's name)
    pass


__all__ = ["BF16_Optimizer"]
