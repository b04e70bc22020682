"""`deepspeed.runtime.zero` (also `deepspeed.zero`): zero.Init, GatheredParameters and the
external-parameter API from zerostream.zero, plus the ZeRO optimizer classes by DeepSpeed's
module names (stage_1_and_2, stage3) for isinstance checks."""

from zerostream.zero import (
    GatheredParameters,
    Init,
    TiledLinear,
    TiledLinearReturnBias,
    ZeroParamStatus,
    register_external_parameter,
    unregister_external_parameter,
)

from . import (
    config,
    leaf_module_config,
    offload_config,
    offload_states,
    partition_parameters,
    stage3,
    stage_1_and_2,
    tiling,
    utils,
)
from .stage3 import unwrap_model_for_generation

__all__ = [
    "GatheredParameters",
    "Init",
    "TiledLinear",
    "TiledLinearReturnBias",
    "ZeroParamStatus",
    "register_external_parameter",
    "unregister_external_parameter",
    "config",
    "leaf_module_config",
    "offload_config",
    "offload_states",
    "partition_parameters",
    "stage3",
    "stage_1_and_2",
    "tiling",
    "utils",
    "unwrap_model_for_generation",
]
