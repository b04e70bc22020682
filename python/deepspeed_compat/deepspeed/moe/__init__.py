"""`deepspeed.moe`: zerostream's MoE import surface (zerostream/moe/): the param-group helper
works; building the expert-parallel MoE layer is refused with an error naming the feature."""

from zerostream.moe import MoE

from . import layer, utils

__all__ = ["layer", "utils", "MoE"]
