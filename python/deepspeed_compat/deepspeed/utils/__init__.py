"""`deepspeed.utils`: the logger, log_dist, process-group getters (groups), zero_to_fp32,
OnDevice and the parameter-level accessors of ZeRO state (safe_get_full_fp32_param, ...;
tensor_fragment).

`logger` and `log_dist` live in `deepspeed.utils.logging`, as in DeepSpeed (PyTorch Lightning
sets the level through `deepspeed.utils.logging.logger`); `logger` is zerostream's logger, so a
tool that sets DeepSpeed's log level (Hugging Face Trainer does, from its own) sets zerostream's.
"""

from __future__ import annotations

from typing import List

import torch

from .._unsupported import Z3_LEAF_MODULES, unsupported
from . import groups, init_on_device, logging, tensor_fragment, zero_to_fp32
from .init_on_device import OnDevice
from .logging import log_dist, logger
from .tensor_fragment import *  # noqa: F403  (the safe_get/set_* accessors)


def set_z3_leaf_modules(model: torch.nn.Module, leaf_module_classes, *args, **kwargs):
    """Accelerate calls this for the MoE layer classes named in its DeepSpeed plugin
    (transformer_moe_cls_names): zerostream's stage 3 gathers per submodule and has no
    leaf-module mode, so it says so instead of ignoring the request."""
    names = [getattr(c, "__name__", str(c)) for c in leaf_module_classes]
    raise unsupported(
        Z3_LEAF_MODULES,
        "deepspeed.utils.set_z3_leaf_modules",
        f"asked for {names}; leave transformer_moe_cls_names / "
        "ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES unset (zerostream gathers each submodule's "
        "parameters as it runs)",
    )


def unset_z3_leaf_modules(model: torch.nn.Module, leaf_module_classes, *args, **kwargs):
    """The counterpart of set_z3_leaf_modules, refused the same way."""
    names = [getattr(c, "__name__", str(c)) for c in leaf_module_classes]
    raise unsupported(
        Z3_LEAF_MODULES, "deepspeed.utils.unset_z3_leaf_modules", f"asked for {names}"
    )


def set_z3_leaf_modules_by_name(model: torch.nn.Module, module_names, *args, **kwargs):
    """Leaf modules by name, refused as set_z3_leaf_modules is."""
    raise unsupported(
        Z3_LEAF_MODULES,
        "deepspeed.utils.set_z3_leaf_modules_by_name",
        f"asked for {list(module_names)}",
    )


def get_z3_leaf_modules(model: torch.nn.Module) -> List[torch.nn.Module]:
    """No module is a ZeRO-3 leaf on zerostream."""
    return []


def z3_leaf_module(model: torch.nn.Module) -> bool:
    return False


__all__ = [
    "groups",
    "init_on_device",
    "logging",
    "tensor_fragment",
    "zero_to_fp32",
    "OnDevice",
    *tensor_fragment.__all__,
    "logger",
    "log_dist",
    "set_z3_leaf_modules",
    "unset_z3_leaf_modules",
    "set_z3_leaf_modules_by_name",
    "get_z3_leaf_modules",
    "z3_leaf_module",
]
