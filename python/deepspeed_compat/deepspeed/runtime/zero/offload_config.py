"""`deepspeed.runtime.zero.offload_config`: offload devices and the offload_param /
offload_optimizer sections (zerostream's typed, resolved section objects)."""

import enum

from zerostream.config import OffloadOptimizerConfig as DeepSpeedZeroOffloadOptimizerConfig
from zerostream.config import OffloadParamConfig as DeepSpeedZeroOffloadParamConfig
from zerostream.zero.state_offload import OffloadStateType as OffloadStateTypeEnum


class OffloadDeviceEnum(str, enum.Enum):
    none = "none"
    cpu = "cpu"
    nvme = "nvme"


__all__ = [
    "DeepSpeedZeroOffloadOptimizerConfig",
    "DeepSpeedZeroOffloadParamConfig",
    "OffloadDeviceEnum",
    "OffloadStateTypeEnum",
]
