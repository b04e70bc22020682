"""`deepspeed.profiling.flops_profiler.profiler`, where DeepSpeed's engine imports the
profiler from."""

from zerostream.profiling import (
    DEFAULT_PRECISION,
    FlopsProfiler,
    bytes_to_string,
    duration_to_string,
    flops_to_string,
    get_model_profile,
    macs_to_string,
    number_to_string,
    params_to_string,
)

__all__ = [
    "DEFAULT_PRECISION",
    "FlopsProfiler",
    "bytes_to_string",
    "duration_to_string",
    "flops_to_string",
    "get_model_profile",
    "macs_to_string",
    "number_to_string",
    "params_to_string",
]
