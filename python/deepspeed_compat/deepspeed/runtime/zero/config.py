"""`deepspeed.runtime.zero.config`: the ZeRO stage enum and the zero_optimization section
(zerostream's typed, resolved section object)."""

import enum

from zerostream.config import ZeroConfig as DeepSpeedZeroConfig


class ZeroStageEnum(enum.IntEnum):
    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3
    max_stage = 3


__all__ = ["DeepSpeedZeroConfig", "ZeroStageEnum"]
