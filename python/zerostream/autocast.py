"""The `torch_autocast` section: the engine's forward runs under torch.autocast.

Note [torch_autocast]
  DeepSpeed 0.17+ can train an fp32 model with torch's own mixed precision instead of its
  bf16/fp16 modes: the parameters, gradients and optimizer stay fp32, and the forward runs
  under `torch.autocast(device, dtype)`. zerostream does the same, with DeepSpeed's rules:
  - `enabled` (false), `dtype` (DeepSpeed's dtype names; absent: torch's default for the
    device, bf16 on a CPU, fp16 on CUDA), `lower_precision_safe_modules` (fully qualified
    class names; default torch.nn.Linear and Conv1d/2d/3d);
  - the parameters of modules whose class is exactly one of the safe modules are tagged
    `comm_dtype` = the autocast dtype, as DeepSpeed tags them;
  - an autocast the caller opened around `engine(...)` is replaced by the engine's
    (enabled: the config's dtype; not enabled: autocast off inside the engine, with a
    warning once), as DeepSpeed does.
  One difference: DeepSpeed reduces the tagged parameters' gradients in the autocast dtype;
  zerostream reduces every gradient as `communication_data_type` says (fp32 by default),
  which is more exact and moves 2 more bytes per tagged element.
  fp16 at ZeRO stage 0 is refused by name: DeepSpeed scales that loss with torch's
  GradScaler, which zerostream does not build.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
from typing import Mapping, Optional, Tuple

import torch

logger = logging.getLogger("zerostream")

# DeepSpeed's DtypeEnum spellings.
_DTYPES = {
    torch.float32: ("fp32", "float32", "float", "torch.float32", "torch.float"),
    torch.float16: ("fp16", "float16", "half", "torch.float16", "torch.half"),
    torch.bfloat16: ("bf16", "bfloat16", "bfloat", "torch.bfloat16"),
}
DEFAULT_SAFE_MODULES: Tuple[type, ...] = (
    torch.nn.Linear,
    torch.nn.Conv1d,
    torch.nn.Conv2d,
    torch.nn.Conv3d,
)
COMM_DTYPE_ATTR = "comm_dtype"  # DeepSpeed's PARAM_COMM_DTYPE_ATTR_NAME


@dataclasses.dataclass(frozen=True)
class AutocastPlan:
    dtype: Optional[torch.dtype]  # None: torch's default for the device
    safe_modules: Tuple[type, ...]


def _dtype(name) -> torch.dtype:
    for dtype, names in _DTYPES.items():
        if isinstance(name, str) and name.lower() in names:
            return dtype
    raise ValueError(
        f"torch_autocast.dtype: {name!r} is not a dtype DeepSpeed accepts (one of "
        f"{sorted(n for names in _DTYPES.values() for n in names)})"
    )


def _module_class(path) -> type:
    module, _, name = str(path).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name) if module else None
    except (ImportError, AttributeError):
        cls = None
    if not isinstance(cls, type) or not issubclass(cls, torch.nn.Module):
        raise ValueError(
            f"torch_autocast.lower_precision_safe_modules: {path!r} is not an importable "
            "torch.nn.Module class (give its fully qualified name, e.g. torch.nn.Linear)"
        )
    return cls


def plan(section: Optional[Mapping], zero_stage: int) -> Optional[AutocastPlan]:
    """The resolved section, or None when autocast is off."""
    if not section or not section.get("enabled", False):
        return None
    dtype = _dtype(section["dtype"]) if section.get("dtype") is not None else None
    if dtype is torch.float16 and zero_stage == 0:
        raise NotImplementedError(
            'torch_autocast.dtype "fp16" at zero_optimization.stage 0: DeepSpeed scales '
            "that loss with torch's GradScaler, which zerostream does not build; use bf16, "
            "or ZeRO stage 1-3"
        )
    names = section.get("lower_precision_safe_modules")
    safe = DEFAULT_SAFE_MODULES if names is None else tuple(_module_class(n) for n in names)
    return AutocastPlan(dtype, safe)


def tag_params(model: torch.nn.Module, p: AutocastPlan, device_type: str) -> int:
    """Tags the params of the safe modules with the autocast dtype; returns how many."""
    dtype = p.dtype or torch.get_autocast_dtype(device_type)
    tagged = 0
    for module in model.modules():
        if type(module) in p.safe_modules:
            for param in module.parameters(recurse=False):
                setattr(param, COMM_DTYPE_ATTR, dtype)
                tagged += 1
    return tagged


_warned_outer = False


@contextlib.contextmanager
def forward_context(p: Optional[AutocastPlan], device_type: str):
    """The autocast state the engine's forward runs in (Note [torch_autocast])."""
    global _warned_outer
    if p is not None:
        with torch.autocast(device_type=device_type, dtype=p.dtype, enabled=True):
            yield
    elif torch.is_autocast_enabled(device_type):
        if not _warned_outer:
            logger.warning(
                "torch.autocast is enabled around the engine, whose config has no "
                "torch_autocast section: the engine runs its forward without it, as DeepSpeed "
                "does (its precision is the bf16/fp16 sections'; to use torch's autocast, "
                'set "torch_autocast": {"enabled": true})'
            )
            _warned_outer = True
        with torch.autocast(device_type=device_type, enabled=False):
            yield
    else:
        yield
