"""`deepspeed.profiling`: the flops profiler (zerostream/profiling/)."""

from . import flops_profiler

__all__ = ["flops_profiler"]
