"""`deepspeed.runtime.config`: `DeepSpeedConfig(config, mpu=None)` reads and validates a
ds_config the way initialize() does and returns zerostream's resolved, typed config
(zerostream.config.DeepSpeedConfig: one frozen section object per ds_config section, key
names as in the JSON). isinstance() against this name holds for such configs."""

from __future__ import annotations

from zerostream import comm
from zerostream import config as _config


class _ConfigType(type):
    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, _config.DeepSpeedConfig)


class DeepSpeedConfig(metaclass=_ConfigType):
    def __new__(cls, config, mpu=None, mesh_device=None):
        """`config`: a dict, a JSON/hjson file path or base64 text. The batch rule is
        checked against the data-parallel world (mpu's, else the initialized world, else 1)."""
        if mpu is not None:
            world = mpu.get_data_parallel_world_size()
        else:
            world = comm.get_world_size()
        return _config.load(config, world_size=world)


DeepSpeedConfigError = ValueError

__all__ = ["DeepSpeedConfig", "DeepSpeedConfigError"]
