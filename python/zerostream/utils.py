"""`zerostream.utils`: what DeepSpeed keeps in `deepspeed.utils` and zerostream implements,
under that path so `import zerostream as deepspeed; deepspeed.utils.safe_get_full_grad(p)`
works: the parameter-level accessors of ZeRO state (zero/param_access.py, see Note [Param
access semantics] there) and OnDevice (on_device.py)."""

from .on_device import OnDevice
from .zero.param_access import (
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
    "OnDevice",
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
