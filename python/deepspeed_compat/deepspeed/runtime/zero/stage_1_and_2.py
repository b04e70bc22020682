"""`deepspeed.runtime.zero.stage_1_and_2`: DeepSpeedZeroOptimizer is zerostream's stage 1/2
optimizer wrapper (the `optimizer` initialize() returns at those stages); the ZeRO-2 memory
estimators live here in DeepSpeed."""

from zerostream.estimate import (
    estimate_zero2_model_states_mem_needs,
    estimate_zero2_model_states_mem_needs_all_cold,
    estimate_zero2_model_states_mem_needs_all_live,
    model_to_params,
)
from zerostream.zero.stage12 import PartitionedOptimizer as DeepSpeedZeroOptimizer

__all__ = [
    "DeepSpeedZeroOptimizer",
    "estimate_zero2_model_states_mem_needs",
    "estimate_zero2_model_states_mem_needs_all_cold",
    "estimate_zero2_model_states_mem_needs_all_live",
    "model_to_params",
]
