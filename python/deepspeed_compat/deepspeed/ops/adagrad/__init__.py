"""`deepspeed.ops.adagrad`: zerostream's fused CPU Adagrad (zerostream/ops/adagrad.py)."""

from zerostream.ops.adagrad import DeepSpeedCPUAdagrad

__all__ = ["DeepSpeedCPUAdagrad"]
