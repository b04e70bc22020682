"""Which of DeepSpeed's optimizer wrappers DeepSpeed's engine would have built for a config
(`engine._do_optimizer_sanity_check` and `_configure_fp16_optimizer` at edaa722), so that
`isinstance(engine.optimizer, BF16_Optimizer)` and the like answer as under DeepSpeed.

zerostream builds one wrapper family for every case (zero/stage0, stage12, stage3); the
classes named here are isinstance views over it, not other implementations:

- ZeRO stage 1, bf16, fp32 gradient accumulation, optimizer not offloaded: BF16_Optimizer
- ZeRO stage 0 in fp16, or in bf16 with bf16 accumulation: FP16_Optimizer when the inner
  optimizer is FusedAdam, else FP16_UnfusedOptimizer
- any other ZeRO stage: DeepSpeedZeroOptimizer (1, 2) or DeepSpeedZeroOptimizer_Stage3
"""

from __future__ import annotations

from typing import Optional

from zerostream.zero.base import ZeroOptimizerBase


def wrapper_name(optimizer) -> Optional[str]:
    if not isinstance(optimizer, ZeroOptimizerBase):
        return None
    config = optimizer.ctx.config
    stage = config.zero_stage
    accum = config.data_types.grad_accum_dtype
    if stage == 1 and config.bf16.enabled and accum == "fp32":
        if config.zero_optimization.offload_optimizer_device in (None, "none"):
            return "BF16_Optimizer"
    if stage == 0:
        if config.fp16.enabled or (config.bf16.enabled and accum in (None, "bf16")):
            from ..ops.adam.fused_adam import FusedAdam

            built = config.optimizer  # a config optimizer "Adam"/"AdamW" is FusedAdam there
            fused = isinstance(optimizer.optimizer, FusedAdam) or (
                built is not None
                and built.name in ("adam", "adamw")
                and not built.params.get("torch_adam", False)
            )
            return "FP16_Optimizer" if fused else "FP16_UnfusedOptimizer"
        return None
    return "DeepSpeedZeroOptimizer_Stage3" if stage == 3 else "DeepSpeedZeroOptimizer"


class WrapperKind(type):
    """Metaclass: `isinstance(x, C)` holds when DeepSpeed would have built C for x's config."""

    def __instancecheck__(cls, obj) -> bool:
        return wrapper_name(obj) == cls.__name__

    def __call__(cls, *args, **kwargs):
        raise TypeError(
            f"{cls.__module__}.{cls.__name__} is built by deepspeed.initialize on zerostream "
            "(from the config's precision and ZeRO stage), not by the caller"
        )
