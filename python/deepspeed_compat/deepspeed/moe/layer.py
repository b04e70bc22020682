"""`deepspeed.moe.layer`: MoE raises NotImplementedError naming expert parallelism."""

from zerostream.moe.layer import MoE

__all__ = ["MoE"]
