"""`deepspeed.utils.timer`: DeepSpeed's wall-clock timers and their names
(zerostream/profiling/timers.py, what `wall_clock_breakdown` times), and `trim_mean`, the
outlier-trimmed mean the comms summary prints; ThroughputTimer, the engine's `tput_timer`
(zerostream/profiling/throughput.py)."""

from zerostream.comm.comms_logging import trim_mean
from zerostream.profiling.throughput import ThroughputTimer
from zerostream.profiling.timers import (
    BACKWARD_GLOBAL_TIMER,
    BACKWARD_INNER_GLOBAL_TIMER,
    BACKWARD_INNER_MICRO_TIMER,
    BACKWARD_MICRO_TIMER,
    BACKWARD_REDUCE_GLOBAL_TIMER,
    BACKWARD_REDUCE_MICRO_TIMER,
    FORWARD_GLOBAL_TIMER,
    FORWARD_MICRO_TIMER,
    STEP_GLOBAL_TIMER,
    STEP_MICRO_TIMER,
    NoopTimer,
    SynchronizedWallClockTimer,
)

__all__ = [
    "BACKWARD_GLOBAL_TIMER",
    "BACKWARD_INNER_GLOBAL_TIMER",
    "BACKWARD_INNER_MICRO_TIMER",
    "BACKWARD_MICRO_TIMER",
    "BACKWARD_REDUCE_GLOBAL_TIMER",
    "BACKWARD_REDUCE_MICRO_TIMER",
    "FORWARD_GLOBAL_TIMER",
    "FORWARD_MICRO_TIMER",
    "NoopTimer",
    "STEP_GLOBAL_TIMER",
    "STEP_MICRO_TIMER",
    "SynchronizedWallClockTimer",
    "ThroughputTimer",
    "trim_mean",
]
