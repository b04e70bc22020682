"""`deepspeed.runtime.zero.utils`: the ZeRO helpers scripts and tests import by this path.
ZeRORuntimeException is zerostream's own (optim_factory.py raises it where DeepSpeed does),
so `pytest.raises` and `except` clauses written for DeepSpeed catch zerostream's errors."""

import torch

from zerostream.ops.adagrad import DeepSpeedCPUAdagrad
from zerostream.ops.adam import DeepSpeedCPUAdam
from zerostream.ops.lion import DeepSpeedCPULion
from zerostream.ops.muon import MuonWithAuxAdam
from zerostream.optim_factory import ZeRORuntimeException

from ...ops.adam import FusedAdam

# The optimizers ZeRO runs without zero_allow_untested_optimizer (DeepSpeed's list, with the
# classes zerostream provides).
ZERO_SUPPORTED_OPTIMIZERS = [
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.Adagrad,
    FusedAdam,
    DeepSpeedCPUAdam,
    DeepSpeedCPUAdagrad,
    DeepSpeedCPULion,
    MuonWithAuxAdam,
]


def is_zero_supported_optimizer(optimizer) -> bool:
    """Whether `optimizer`'s exact class is one ZeRO is tested with."""
    return type(optimizer) in ZERO_SUPPORTED_OPTIMIZERS


def is_zero_param(parameter) -> bool:
    """Whether `parameter` is a tensor ZeRO-3 partitioned (it carries a ds_id)."""
    return torch.is_tensor(parameter) and hasattr(parameter, "ds_id")


def is_builtin_type(obj) -> bool:
    return type(obj).__module__ in ("builtins", "__builtin__")


def isinstance_namedtuple(obj) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_asdict") and hasattr(obj, "_fields")


__all__ = [
    "ZERO_SUPPORTED_OPTIMIZERS",
    "ZeRORuntimeException",
    "is_builtin_type",
    "is_zero_param",
    "is_zero_supported_optimizer",
    "isinstance_namedtuple",
]
