"""`deepspeed.runtime.torch_autocast`: the names DeepSpeed's `torch_autocast` section uses to
tag the parameters whose gradients it communicates in a lower precision.

zerostream does not implement the `torch_autocast` section (the config says so when it is
enabled), so no parameter is ever tagged: `has_comm_dtype` is False and `get_comm_dtype` is
the parameter's own dtype, which is the dtype zerostream communicates it in.
"""

from __future__ import annotations

from typing import Iterable, Set

import torch

PARAM_COMM_DTYPE_ATTR_NAME = "comm_dtype"


def has_comm_dtype(param: torch.nn.Parameter) -> bool:
    return hasattr(param, PARAM_COMM_DTYPE_ATTR_NAME)


def get_comm_dtype(param: torch.nn.Parameter) -> torch.dtype:
    return getattr(param, PARAM_COMM_DTYPE_ATTR_NAME, param.dtype)


def get_all_comm_dtypes(params: Iterable[torch.nn.Parameter]) -> Set[torch.dtype]:
    return {get_comm_dtype(p) for p in params}


__all__ = ["PARAM_COMM_DTYPE_ATTR_NAME", "get_all_comm_dtypes", "get_comm_dtype", "has_comm_dtype"]
