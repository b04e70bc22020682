"""`deepspeed.ops.adam.cpu_adam`: zerostream's fused CPU Adam/AdamW (zerostream/ops/adam.py)."""

from zerostream.ops.adam import DeepSpeedCPUAdam

__all__ = ["DeepSpeedCPUAdam"]
