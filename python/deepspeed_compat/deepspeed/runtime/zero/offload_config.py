"""`deepspeed.runtime.zero.offload_config`: offload devices and the offload_param /
offload_optimizer sections (zerostream's typed, resolved section objects)."""

import enum

from zerostream.zero.state_offload import OffloadStateType as OffloadStateTypeEnum

# The validating constructors (defaults from the schema; `DeepSpeedZeroOffloadOptimizerConfig()`
# is the section with every default), whose isinstance() accepts zerostream's section objects.
from .config import DeepSpeedZeroOffloadOptimizerConfig, DeepSpeedZeroOffloadParamConfig


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
