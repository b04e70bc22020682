"""`deepspeed.runtime.zero.tiling`: TiledLinear (zerostream/zero/stage3/tiling.py)."""

from zerostream.zero.stage3.tiling import TiledLinear, TiledLinearReturnBias

__all__ = ["TiledLinear", "TiledLinearReturnBias"]
