"""`deepspeed.runtime.zero.stage3`: DeepSpeedZeroOptimizer_Stage3 is zerostream's stage 3
optimizer wrapper (the `optimizer` initialize() returns at stage 3); the ZeRO-3 memory
estimators live here in DeepSpeed, and `unwrap_model_for_generation`."""

import contextlib

from zerostream.estimate import (
    estimate_zero3_model_states_mem_needs,
    estimate_zero3_model_states_mem_needs_all_cold,
    estimate_zero3_model_states_mem_needs_all_live,
)
from zerostream.zero import GatheredParameters
from zerostream.zero.stage3.optimizer import Stage3Optimizer as DeepSpeedZeroOptimizer_Stage3


@contextlib.contextmanager
def unwrap_model_for_generation(model):
    """Every ZeRO-3 parameter of `model` (an engine or a module) gathered for the block, as
    for generation, where each step runs the whole model; yields `model`. The stage-3
    hooks stay installed: a parameter gathered here is held (GatheredParameters counts it as
    in use), so they neither fetch nor release it. Parameters are re-partitioned on exit;
    changes made inside are dropped, as with GatheredParameters(modifier_rank=None)."""
    with GatheredParameters(list(model.parameters())):
        yield model


__all__ = [
    "DeepSpeedZeroOptimizer_Stage3",
    "estimate_zero3_model_states_mem_needs",
    "estimate_zero3_model_states_mem_needs_all_cold",
    "estimate_zero3_model_states_mem_needs_all_live",
    "unwrap_model_for_generation",
]
