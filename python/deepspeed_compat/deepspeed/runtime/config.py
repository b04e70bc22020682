"""`deepspeed.runtime.config`: `DeepSpeedConfig(config, mpu=None)` reads and validates a
ds_config the way initialize() does and returns zerostream's resolved, typed config
(zerostream.config.DeepSpeedConfig: one frozen section object per ds_config section, key
names as in the JSON). isinstance() against this name holds for such configs."""

from __future__ import annotations

from dataclasses import fields

from zerostream import comm
from zerostream import config as _config

from . import constants as _constants


class _ConfigType(type):
    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, _config.DeepSpeedConfig)


_BATCH_FIELDS = (
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
)


class _ResolvedConfig(_config.DeepSpeedConfig):
    """zerostream's resolved config as DeepSpeedConfig(...) returns it: frozen like it, but
    for DeepSpeed's three batch fields, which a caller may assign and then resolve again with
    `_configure_train_batch_size()` (DeepSpeed's own tests of its batch rule do)."""

    _world = 1

    def __setattr__(self, name, value) -> None:
        if name not in _BATCH_FIELDS:
            super().__setattr__(name, value)  # frozen: raises, naming the field
        object.__setattr__(self, name, value)

    def _configure_train_batch_size(self) -> None:
        """DeepSpeed's batch rule over the fields as assigned: the missing ones derived from
        the others and the data-parallel world, then train = micro x accumulation x world;
        an AssertionError when they cannot agree (DeepSpeed's exception)."""
        train, micro, gas = (getattr(self, f) for f in _BATCH_FIELDS)
        world = self._world
        if train is not None and micro is not None and gas is None:
            gas = train // micro // world
        elif train is not None and gas is not None and micro is None:
            micro = train // world // gas
        elif micro is not None and gas is not None and train is None:
            train = micro * gas * world
        elif train is not None and micro is None and gas is None:
            gas, micro = 1, train // world
        elif micro is not None and train is None and gas is None:
            gas, train = 1, micro * world
        elif train is None or micro is None or gas is None:
            raise AssertionError(
                "Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided"
            )
        for name, value in zip(_BATCH_FIELDS, (train, micro, gas)):
            if not value or value <= 0:
                raise AssertionError(f"{name}: {value} is not greater than 0")
        if train != micro * gas * world:
            raise AssertionError(
                f"Check batch related parameters. train_batch_size is not equal to "
                f"micro_batch_per_gpu * gradient_acc_step * world_size {train} != {micro} * "
                f"{gas} * {world}"
            )
        for name, value in zip(_BATCH_FIELDS, (train, micro, gas)):
            object.__setattr__(self, name, value)


class DeepSpeedConfig(metaclass=_ConfigType):
    def __new__(cls, config, mpu=None, mesh_device=None):
        """`config`: a dict, a JSON/hjson file path or base64 text. The batch rule is
        checked against the data-parallel world (mpu's, else the initialized world, else 1)."""
        if mpu is not None:
            world = mpu.get_data_parallel_world_size()
        else:
            world = comm.get_world_size()
        resolved = _config.load(config, world_size=world)
        out = _ResolvedConfig(**{f.name: getattr(resolved, f.name) for f in fields(resolved)})
        object.__setattr__(out, "_world", world)
        return out


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
