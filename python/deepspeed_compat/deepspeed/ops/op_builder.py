"""`deepspeed.ops.op_builder`: DeepSpeed's op builders, as far as code outside DeepSpeed uses
them: `NAME`, `is_compatible()` (tests and Accelerate ask before using an op) and
`absolute_name()`. zerostream compiles nothing at run time: its CPU optimizers and async I/O
are in zerostream._C, FusedAdam is torch's Adam, FusedLion and the utils op torch ops, so those
builders are compatible; the
CUDA-only kernels zerostream does not have (LAMB, the transformer and inference kernels,
...) are not. `load()` returns DeepSpeed's raw op module, an internal interface zerostream
does not reproduce: it raises, naming the public class to use instead.
"""

from __future__ import annotations

import types

import torch

from zerostream.ops.aio import AsyncIOBuilder
from zerostream.ops.pin_memory import PinMemoryBuilder


class OpBuilder:
    NAME = ""
    BUILD_VAR = ""
    COMPATIBLE = False
    USE_INSTEAD = ""

    def __init__(self, name: str | None = None):
        self.name = name or self.NAME

    def is_compatible(self, verbose: bool = False) -> bool:
        return self.COMPATIBLE

    def absolute_name(self) -> str:
        return f"deepspeed.ops.{self.NAME}_op"

    def builder(self):
        return self

    def load(self, verbose: bool = True):
        if not self.COMPATIBLE:
            raise RuntimeError(f"op {self.NAME!r} is not available on zerostream")
        raise NotImplementedError(
            f"{type(self).__name__}().load(): DeepSpeed's raw {self.NAME} op module is internal to "
            f"DeepSpeed; zerostream's kernel is reached through {self.USE_INSTEAD}"
        )


def _builder(class_name: str, name: str, compatible: bool, use_instead: str = "") -> type:
    return type(
        class_name,
        (OpBuilder,),
        {
            "NAME": name,
            "BUILD_VAR": f"DS_BUILD_{name.upper()}",
            "COMPATIBLE": compatible,
            "USE_INSTEAD": use_instead,
        },
    )


CPUAdamBuilder = _builder("CPUAdamBuilder", "cpu_adam", True, "deepspeed.ops.adam.DeepSpeedCPUAdam")
CPUAdagradBuilder = _builder(
    "CPUAdagradBuilder", "cpu_adagrad", True, "deepspeed.ops.adagrad.DeepSpeedCPUAdagrad"
)
CPULionBuilder = _builder("CPULionBuilder", "cpu_lion", True, "deepspeed.ops.lion.DeepSpeedCPULion")
FusedAdamBuilder = _builder("FusedAdamBuilder", "fused_adam", True, "deepspeed.ops.adam.FusedAdam")
FusedLambBuilder = _builder("FusedLambBuilder", "fused_lamb", False)
FusedLionBuilder = _builder("FusedLionBuilder", "fused_lion", True, "deepspeed.ops.lion.FusedLion")
QuantizerBuilder = _builder("QuantizerBuilder", "quantizer", False)  # ZeRO++: not implemented
CPUAdamBuilder.__doc__ = "DeepSpeedCPUAdam's kernels: zerostream._C's fused CPU optimizers."


def _byte_view(tensor: torch.Tensor) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor) or tensor.dim() != 1 or not tensor.is_contiguous():
        got = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise ValueError(f"cast_to_byte_tensor: expected a contiguous 1-D tensor; got {got}")
    return tensor.view(torch.uint8)


def cast_to_byte_tensor(src_tensor):
    """DeepSpeed's utils op: a uint8 view of a 1-D tensor's bytes (same memory, numel x
    element size bytes), or of each tensor of a list."""
    if isinstance(src_tensor, (list, tuple)):
        return [_byte_view(t) for t in src_tensor]
    return _byte_view(src_tensor)


class UtilsBuilder(OpBuilder):
    """DeepSpeed's utils op (byte casts), in torch: `load()` returns a module with
    `cast_to_byte_tensor`."""

    NAME = "utils"
    BUILD_VAR = "DS_BUILD_UTILS"
    COMPATIBLE = True

    def load(self, verbose: bool = True):
        return types.SimpleNamespace(cast_to_byte_tensor=cast_to_byte_tensor)


# What git_version_info reports as compatible (and, nothing being built at run time, installed).
ALL_OPS = {
    b.NAME: b
    for b in (
        CPUAdamBuilder,
        CPUAdagradBuilder,
        CPULionBuilder,
        FusedAdamBuilder,
        FusedLambBuilder,
        FusedLionBuilder,
        AsyncIOBuilder,
        PinMemoryBuilder,
        QuantizerBuilder,
        UtilsBuilder,
    )
}

__all__ = [
    "ALL_OPS",
    "AsyncIOBuilder",
    "CPUAdagradBuilder",
    "CPUAdamBuilder",
    "CPULionBuilder",
    "FusedAdamBuilder",
    "FusedLambBuilder",
    "FusedLionBuilder",
    "OpBuilder",
    "PinMemoryBuilder",
    "QuantizerBuilder",
    "UtilsBuilder",
]
