"""`deepspeed.ops.lion`: zerostream's fused CPU Lion (zerostream/ops/lion.py) and FusedLion,
the device Lion a non-offloaded "Lion" optimizer builds."""

from zerostream.ops.lion import DeepSpeedCPULion, FusedLion

__all__ = ["DeepSpeedCPULion", "FusedLion"]
