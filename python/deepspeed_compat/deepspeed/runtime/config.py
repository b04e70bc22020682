"""`deepspeed.runtime.config`: `DeepSpeedConfig(config, mpu=None)` reads and validates a
ds_config the way initialize() does and returns zerostream's resolved, typed config
(zerostream.config.DeepSpeedConfig: one frozen section object per ds_config section, key
names as in the JSON). isinstance() against this name holds for such configs."""

from __future__ import annotations

from zerostream import comm
from zerostream import config as _config

from . import constants as _constants


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


# DeepSpeed's optimizer type names (config "optimizer.type", matched lowercased) and the
# readers of single top-level keys (runtime/config.py in DeepSpeed).
ADAGRAD_OPTIMIZER = "adagrad"
ADAM_OPTIMIZER = "adam"
ADAMW_OPTIMIZER = "adamw"
LAMB_OPTIMIZER = "lamb"
ONEBIT_ADAM_OPTIMIZER = "onebitadam"
ZERO_ONE_ADAM_OPTIMIZER = "zerooneadam"
ONEBIT_LAMB_OPTIMIZER = "onebitlamb"
MUADAM_OPTIMIZER = "muadam"
MUADAMW_OPTIMIZER = "muadamw"
MUSGD_OPTIMIZER = "musgd"
LION_OPTIMIZER = "lion"
MUON_OPTIMIZER = "muon"
DEEPSPEED_OPTIMIZERS = [
    ADAGRAD_OPTIMIZER, ADAM_OPTIMIZER, ADAMW_OPTIMIZER, LAMB_OPTIMIZER, ONEBIT_ADAM_OPTIMIZER,
    ONEBIT_LAMB_OPTIMIZER, ZERO_ONE_ADAM_OPTIMIZER, MUADAM_OPTIMIZER, MUADAMW_OPTIMIZER,
    MUSGD_OPTIMIZER, LION_OPTIMIZER, MUON_OPTIMIZER,
]  # fmt: skip


def get_gradient_clipping(param_dict: dict) -> float:
    return param_dict.get(_constants.GRADIENT_CLIPPING, _constants.GRADIENT_CLIPPING_DEFAULT)


def get_log_level(param_dict: dict):
    return param_dict.get(_constants.LOG_LEVEL, _constants.LOG_LEVEL_DEFAULT)


__all__ += ["DEEPSPEED_OPTIMIZERS", "get_gradient_clipping", "get_log_level"]
