"""`deepspeed.ops`: zerostream's CPU optimizers (native fused kernels, no JIT build), torch's
fused Adam as FusedAdam, and the async I/O handle."""

from ..git_version_info import compatible_ops as __compatible_ops__
from . import adagrad, adam, aio, lion, op_builder

__all__ = ["__compatible_ops__", "adam", "adagrad", "lion", "aio", "op_builder"]
