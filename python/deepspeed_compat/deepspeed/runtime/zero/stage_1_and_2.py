"""`deepspeed.runtime.zero.stage_1_and_2`: DeepSpeedZeroOptimizer is zerostream's stage 1/2
optimizer wrapper (the `optimizer` initialize() returns at those stages)."""

from zerostream.zero.stage12 import PartitionedOptimizer as DeepSpeedZeroOptimizer

__all__ = ["DeepSpeedZeroOptimizer"]
