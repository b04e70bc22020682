"""`deepspeed.runtime.torch_autocast`: the names DeepSpeed's `torch_autocast` section uses
(Note [torch_autocast] in zerostream/autocast.py): the `comm_dtype` tag an engine with the
section enabled puts on the params of its lower-precision-safe modules, and its readers."""

from __future__ import annotations

from typing import Iterable, Set

import torch

from zerostream.autocast import COMM_DTYPE_ATTR as PARAM_COMM_DTYPE_ATTR_NAME
from zerostream.autocast import DEFAULT_SAFE_MODULES as LOWER_PRECISION_SAFE_MODULES


def has_comm_dtype(param: torch.nn.Parameter) -> bool:
    return hasattr(param, PARAM_COMM_DTYPE_ATTR_NAME)


def get_comm_dtype(param: torch.nn.Parameter) -> torch.dtype:
    return getattr(param, PARAM_COMM_DTYPE_ATTR_NAME, param.dtype)


def get_all_comm_dtypes(params: Iterable[torch.nn.Parameter]) -> Set[torch.dtype]:
    return {get_comm_dtype(p) for p in params}


__all__ = [
    "LOWER_PRECISION_SAFE_MODULES",
    "PARAM_COMM_DTYPE_ATTR_NAME",
    "get_all_comm_dtypes",
    "get_comm_dtype",
    "has_comm_dtype",
]
