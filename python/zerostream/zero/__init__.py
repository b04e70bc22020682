"""`zerostream.zero`: the ZeRO API DeepSpeed scripts import (`deepspeed.zero.*`): zero.Init,
GatheredParameters, external parameters, ZeroParamStatus (stage 3 lives in zero/stage3/)."""

from __future__ import annotations

import torch

from .stage3.gathered import GatheredParameters
from .stage3.init import Init
from .stage3.param import ZeroParamStatus

__all__ = [
    "Init",
    "GatheredParameters",
    "ZeroParamStatus",
    "register_external_parameter",
    "unregister_external_parameter",
]


def register_external_parameter(module: torch.nn.Module, parameter: torch.nn.Parameter) -> None:
    """Declares that `module` uses `parameter` owned elsewhere; only stage 3 needs to know."""
    if not isinstance(parameter, torch.nn.Parameter):
        raise RuntimeError("register_external_parameter: parameter must be a torch.nn.Parameter")
    external = module.__dict__.setdefault("_zs_external_params", {})
    external[id(parameter)] = parameter


def unregister_external_parameter(module: torch.nn.Module, parameter: torch.nn.Parameter) -> None:
    if not isinstance(parameter, torch.nn.Parameter):
        raise RuntimeError("unregister_external_parameter: parameter must be a torch.nn.Parameter")
    module.__dict__.get("_zs_external_params", {}).pop(id(parameter), None)
