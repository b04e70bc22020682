"""`deepspeed.runtime.zero.stage3`: DeepSpeedZeroOptimizer_Stage3 is zerostream's stage 3
optimizer wrapper (the `optimizer` initialize() returns at stage 3); the ZeRO-3 memory
estimators live here in DeepSpeed."""

from zerostream.estimate import (
    estimate_zero3_model_states_mem_needs,
    estimate_zero3_model_states_mem_needs_all_cold,
    estimate_zero3_model_states_mem_needs_all_live,
)
from zerostream.zero.stage3.optimizer import Stage3Optimizer as DeepSpeedZeroOptimizer_Stage3

__all__ = [
    "DeepSpeedZeroOptimizer_Stage3",
    "estimate_zero3_model_states_mem_needs",
    "estimate_zero3_model_states_mem_needs_all_cold",
    "estimate_zero3_model_states_mem_needs_all_live",
]
