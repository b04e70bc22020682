"""`deepspeed.ops.adam.FusedAdam`: zerostream's (zerostream/ops/fused_adam.py), DeepSpeed's
constructor over torch's fused Adam; the engine builds it for a config's Adam/AdamW without
offload, as DeepSpeed does."""

from zerostream.ops.fused_adam import FusedAdam

__all__ = ["FusedAdam"]
