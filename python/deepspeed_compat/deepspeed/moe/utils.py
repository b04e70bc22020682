"""`deepspeed.moe.utils`: DeepSpeed's MoE param-group helpers (zerostream/moe/utils.py)."""

from zerostream.moe.utils import (
    has_moe_layers,
    is_moe_param,
    is_moe_param_group,
    split_params_into_different_moe_groups_for_optimizer,
    split_params_into_shared_and_expert_params,
)

__all__ = [
    "has_moe_layers",
    "is_moe_param",
    "is_moe_param_group",
    "split_params_into_different_moe_groups_for_optimizer",
    "split_params_into_shared_and_expert_params",
]
