"""`deepspeed.utils`: the logger, log_dist, process-group getters (groups), zero_to_fp32,
OnDevice, the numactl binding (numa) and the parameter-level accessors of ZeRO state
(safe_get_full_fp32_param, ...; tensor_fragment).

`logger` and `log_dist` live in `deepspeed.utils.logging`, as in DeepSpeed (PyTorch Lightning
sets the level through `deepspeed.utils.logging.logger`); `logger` is zerostream's logger, so a
tool that sets DeepSpeed's log level (Hugging Face Trainer does, from its own) sets zerostream's.
"""

from __future__ import annotations

from typing import List, Tuple

import torch

from zerostream.data import RepeatingLoader
from zerostream.zero.stage3 import leaf as _leaf

from . import groups, init_on_device, logging, numa, tensor_fragment, zero_to_fp32
from .init_on_device import OnDevice
from .logging import log_dist, logger, set_log_level_from_string
from .numa import get_numactl_cmd
from .tensor_fragment import *  # noqa: F403  (the safe_get/set_* accessors)


def set_z3_leaf_modules(
    model: torch.nn.Module, leaf_module_classes, raise_if_not_found: bool = True
):
    """Marks every module that is an instance of one of `leaf_module_classes` (types, or
    class names plain or fully qualified) as a ZeRO-3 leaf: gathered whole, its submodules
    unhooked (Note [Leaf modules] in zerostream/zero/stage3/leaf.py). Call it before
    initialize. Returns the marked modules; none found is a ValueError unless
    `raise_if_not_found` is False."""
    return _leaf.mark_by_class(model, leaf_module_classes, True, raise_if_not_found)


def unset_z3_leaf_modules(
    model: torch.nn.Module, leaf_module_classes, raise_if_not_found: bool = True
):
    """Clears the leaf mark set_z3_leaf_modules sets; returns the modules cleared."""
    return _leaf.mark_by_class(model, leaf_module_classes, False, raise_if_not_found)


def set_z3_leaf_modules_by_name(
    model: torch.nn.Module, module_names, flag: bool = True, raise_if_not_found: bool = True
) -> Tuple[List[torch.nn.Module], List[str]]:
    """Marks (or clears) the modules at these `named_modules()` paths; returns the modules
    and the names that matched none."""
    return _leaf.mark_by_name(model, module_names, flag, raise_if_not_found)


def set_z3_leaf_modules_by_suffix(
    model: torch.nn.Module, module_name_suffixes, flag: bool = True, raise_if_not_found: bool = True
) -> Tuple[List[torch.nn.Module], List[str]]:
    """Marks (or clears) every module whose `named_modules()` path ends with one of the
    suffixes; returns the modules and the suffixes that matched none."""
    return _leaf.mark_by_name(model, module_name_suffixes, flag, raise_if_not_found, suffix=True)


def set_z3_leaf_module(model: torch.nn.Module, flag: bool) -> None:
    setattr(model, _leaf.LEAF_ATTR, flag)


def get_z3_leaf_modules(model: torch.nn.Module) -> List[torch.nn.Module]:
    """The modules of `model` marked as ZeRO-3 leaves."""
    return [m for m in model.modules() if _leaf.is_leaf(m)]


def z3_leaf_module(model: torch.nn.Module) -> bool:
    return _leaf.is_leaf(model)


def z3_leaf_parameter(param: torch.nn.Parameter) -> bool:
    """Whether a ZeRO-3 engine gathers `param` as part of a leaf module."""
    return hasattr(param, "ds_z3_leaf_module")


__all__ = [
    "groups",
    "init_on_device",
    "logging",
    "numa",
    "tensor_fragment",
    "zero_to_fp32",
    "OnDevice",
    *tensor_fragment.__all__,
    "logger",
    "log_dist",
    "set_log_level_from_string",
    "RepeatingLoader",
    "get_numactl_cmd",
    "set_z3_leaf_modules",
    "unset_z3_leaf_modules",
    "set_z3_leaf_modules_by_name",
    "set_z3_leaf_modules_by_suffix",
    "set_z3_leaf_module",
    "z3_leaf_parameter",
    "get_z3_leaf_modules",
    "z3_leaf_module",
]
