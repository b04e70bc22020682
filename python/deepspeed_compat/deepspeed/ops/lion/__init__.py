"""`deepspeed.ops.lion`: zerostream's fused CPU Lion (zerostream/ops/lion.py)."""

from zerostream.ops.lion import DeepSpeedCPULion

__all__ = ["DeepSpeedCPULion"]
