"""`deepspeed.runtime`: the engine, config, LR schedules and ZeRO (zero/) under DeepSpeed's
paths. Submodules are imported here, as DeepSpeed's own __init__ does, so attribute paths
such as `deepspeed.runtime.lr_schedules.VALID_LR_SCHEDULES` work after `import deepspeed`."""

from . import activation_checkpointing, base_optimizer, config, engine, lr_schedules, utils, zero

__all__ = [
    "activation_checkpointing",
    "base_optimizer",
    "config",
    "engine",
    "lr_schedules",
    "utils",
    "zero",
]
