"""`deepspeed.ops`: zerostream's CPU optimizers (native fused kernels, no JIT build), torch's
fused Adam as FusedAdam, and the async I/O handle."""

from . import adagrad, adam, aio, lion, op_builder

# The ops zerostream has, by DeepSpeed's op names (git_version_info.compatible_ops too).
__compatible_ops__ = {name: b().is_compatible() for name, b in op_builder.ALL_OPS.items()}

__all__ = ["__compatible_ops__", "adam", "adagrad", "lion", "aio", "op_builder"]
