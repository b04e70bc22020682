"""`deepspeed.utils.tensor_fragment`: the parameter-level accessors of ZeRO state
(zerostream/zero/param_access.py; Note [Param access semantics] there says what each returns
and which are collectives)."""

from zerostream.zero import param_access
from zerostream.zero.param_access import *  # noqa: F403  (the safe_get/set_* accessors)

__all__ = list(param_access.__all__)
