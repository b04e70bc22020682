"""`deepspeed.runtime.zero.partition_parameters`: zero.Init and friends, plus the names code
that adjusts DeepSpeed's zero.Init reaches for.

DeepSpeed's zero.Init wraps torch's tensor constructors (through
`zero_wrapper_for_fp_tensor_constructor`) to create every float tensor in the target dtype on
the device; transformers swaps that wrapper for one that spares `torch.arange` (RoPE buffers).
zerostream's zero.Init converts parameters when their module is built and never wraps the
constructors, so buffers keep the dtype their code asked for; the wrapper below is kept for
code that reads or replaces it and has no effect on zerostream's Init.
"""

from __future__ import annotations

import functools

import torch

from zerostream.accelerator import get_accelerator
from zerostream.zero import (
    GatheredParameters,
    Init,
    ZeroParamStatus,
    register_external_parameter,
    unregister_external_parameter,
)
from zerostream.zero.stage3.init import contradicting_single_rank_group

# DeepSpeed's name (#8084); zero.Init raises its message.
_contradicting_single_rank_pg_error = contradicting_single_rank_group

_orig_torch_arange = torch.arange
_orig_torch_empty = torch.empty
_orig_torch_zeros = torch.zeros
_orig_torch_ones = torch.ones
_orig_torch_full = torch.full


def zero_wrapper_for_fp_tensor_constructor(fn, target_fp_dtype, target_device=None):
    """`fn` (a tensor constructor) made to place its result on `target_device` (unless the
    call names a device) and to convert floating results to `target_fp_dtype`."""

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        if kwargs.get("device") is None and target_device is not None:
            kwargs["device"] = target_device
        tensor = fn(*args, **kwargs)
        return tensor.to(target_fp_dtype) if tensor.is_floating_point() else tensor

    return wrapped


# The shape of a partitioned parameter's `.data` (an empty tensor until it is gathered:
# zerostream/zero/stage3/param.py), as DeepSpeed's tests compare it.
partitioned_param_data_shape = [0]


class MultipleAllGatherHandles:
    """Several gathers' handles as one (DeepSpeed's name): wait() waits for each, passing
    handle_dependency on by keyword."""

    def __init__(self, handles):
        self.handles = list(handles)

    def wait(self, handle_dependency: bool = True) -> None:
        for handle in self.handles:
            handle.wait(handle_dependency=handle_dependency)


__all__ = [
    "MultipleAllGatherHandles",
    "partitioned_param_data_shape",
    "GatheredParameters",
    "Init",
    "ZeroParamStatus",
    "register_external_parameter",
    "unregister_external_parameter",
    "get_accelerator",
    "zero_wrapper_for_fp_tensor_constructor",
]
