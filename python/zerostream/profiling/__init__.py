"""Profiling: DeepSpeed's flops profiler (the flops, MACs, parameters and latency of a
forward, per module; `flops_profiler.py` on torch's FlopCounterMode, `counting.py`) and its
wall-clock timers (`timers.py`, what `wall_clock_breakdown` times). The engine's use of them
is engine/profiling.py."""

from .flops_profiler import FlopsProfiler, ModuleProfile, get_model_profile
from .report import (
    DEFAULT_PRECISION,
    bytes_to_string,
    duration_to_string,
    flops_to_string,
    macs_to_string,
    number_to_string,
    params_to_string,
)
from .timers import NoopTimer, PhaseTimers, SynchronizedWallClockTimer

__all__ = [
    "DEFAULT_PRECISION",
    "FlopsProfiler",
    "ModuleProfile",
    "NoopTimer",
    "PhaseTimers",
    "SynchronizedWallClockTimer",
    "bytes_to_string",
    "duration_to_string",
    "flops_to_string",
    "get_model_profile",
    "macs_to_string",
    "number_to_string",
    "params_to_string",
]
