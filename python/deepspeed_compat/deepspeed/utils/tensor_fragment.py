"""`deepspeed.utils.tensor_fragment`: the parameter-level accessors of ZeRO state
(zerostream/zero/param_access.py; Note [Param access semantics] there says what each returns
and which are collectives)."""

from zerostream.zero.param_access import (
    safe_get_full_fp32_param,
    safe_get_full_grad,
    safe_get_full_optimizer_state,
    safe_get_local_fp32_param,
    safe_get_local_grad,
    safe_get_local_optimizer_state,
    safe_set_full_fp32_param,
    safe_set_full_grad,
    safe_set_full_optimizer_state,
    safe_set_local_fp32_param,
    safe_set_local_grad,
    safe_set_local_optimizer_state,
)

__all__ = [
    "safe_get_full_fp32_param",
    "safe_get_full_grad",
    "safe_get_full_optimizer_state",
    "safe_get_local_fp32_param",
    "safe_get_local_grad",
    "safe_get_local_optimizer_state",
    "safe_set_full_fp32_param",
    "safe_set_full_grad",
    "safe_set_full_optimizer_state",
    "safe_set_local_fp32_param",
    "safe_set_local_grad",
    "safe_set_local_optimizer_state",
]
