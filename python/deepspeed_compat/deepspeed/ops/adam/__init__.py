"""`deepspeed.ops.adam`: DeepSpeedCPUAdam (zerostream's kernel), FusedAdam, and ZenFlow's
optimizers by DeepSpeed's names (ZenFlowCPUAdam, ZenFlowSelectiveAdamW and its stage-3
layout)."""

from .cpu_adam import DeepSpeedCPUAdam
from .fused_adam import FusedAdam
from .zenflow_cpu_adam import ZenFlowCPUAdam
from .zenflow_torch_adam import ZenFlowSelectiveAdamW, ZenFlowSelectiveAdamW_stage3

__all__ = [
    "DeepSpeedCPUAdam",
    "FusedAdam",
    "ZenFlowCPUAdam",
    "ZenFlowSelectiveAdamW",
    "ZenFlowSelectiveAdamW_stage3",
]
