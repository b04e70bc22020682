"""DeepSpeed's MoE import surface (`deepspeed.moe.*`): the param-group helper scripts call on
any model, and the MoE layer, which zerostream refuses to build.

zerostream has no expert parallelism: no all-to-all dispatch, no expert-parallel process
groups, no expert-data-parallel gradient reduction. A script that only imports these names
(DeepSpeed's CIFAR example does, MoE or not) runs; one that builds a `MoE` layer, or hands
initialize() expert parameters, gets an error naming the feature. Mixture-of-experts models
whose experts are ordinary modules (Hugging Face's Mixtral, Qwen-MoE, ...) are plain
data-parallel models to ZeRO and need none of this.
"""

from . import layer, utils
from .layer import MoE
from .utils import (
    has_moe_layers,
    is_moe_param,
    is_moe_param_group,
    split_params_into_different_moe_groups_for_optimizer,
    split_params_into_shared_and_expert_params,
)

__all__ = [
    "layer",
    "utils",
    "MoE",
    "has_moe_layers",
    "is_moe_param",
    "is_moe_param_group",
    "split_params_into_different_moe_groups_for_optimizer",
    "split_params_into_shared_and_expert_params",
]
