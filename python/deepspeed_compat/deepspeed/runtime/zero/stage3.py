"""`deepspeed.runtime.zero.stage3`: DeepSpeedZeroOptimizer_Stage3 is zerostream's stage 3
optimizer wrapper (the `optimizer` initialize() returns at stage 3)."""

from zerostream.zero.stage3.optimizer import Stage3Optimizer as DeepSpeedZeroOptimizer_Stage3

__all__ = ["DeepSpeedZeroOptimizer_Stage3"]
