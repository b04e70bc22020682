"""`deepspeed.ops`: zerostream's CPU optimizers (native fused kernels, no JIT build), torch's
fused Adam as FusedAdam, and the async I/O handle."""

from . import adagrad, adam, aio, lion

__all__ = ["adam", "adagrad", "lion", "aio"]
