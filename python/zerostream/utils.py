"""`zerostream.utils`: what DeepSpeed keeps in `deepspeed.utils` and zerostream implements,
under that path so `import zerostream as deepspeed; deepspeed.utils.safe_get_full_grad(p)`
works: the parameter-level accessors of ZeRO state (zero/param_access.py, see Note [Param
access semantics] there) and OnDevice (on_device.py)."""

from .on_device import OnDevice
from .zero import param_access
from .zero.param_access import *  # noqa: F403  (the safe_get/set_* accessors)

__all__ = ["OnDevice", *param_access.__all__]
