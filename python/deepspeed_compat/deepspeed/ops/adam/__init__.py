"""`deepspeed.ops.adam`: DeepSpeedCPUAdam (zerostream's kernel) and FusedAdam."""

from .cpu_adam import DeepSpeedCPUAdam
from .fused_adam import FusedAdam

__all__ = ["DeepSpeedCPUAdam", "FusedAdam"]
