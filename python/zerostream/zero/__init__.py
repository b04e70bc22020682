"""`zerostream.zero`: the ZeRO API DeepSpeed scripts import (`deepspeed.zero.*`): zero.Init,
GatheredParameters, external parameters, ZeroParamStatus, TiledLinear (stage 3 lives in
zero/stage3/)."""

from __future__ import annotations

from .stage3.gathered import GatheredParameters
from .stage3.init import Init
from .stage3.module_state import register_external_parameter, unregister_external_parameter
from .stage3.param import ZeroParamStatus
from .stage3.tiling import TiledLinear, TiledLinearReturnBias

__all__ = [
    "Init",
    "GatheredParameters",
    "ZeroParamStatus",
    "TiledLinear",
    "TiledLinearReturnBias",
    "register_external_parameter",
    "unregister_external_parameter",
]
