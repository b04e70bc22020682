"""The engine's throughput timer (DeepSpeed's `engine.tput_timer`, `ThroughputTimer`): the
samples per second of the training loop, logged every `steps_per_print` global steps as
DeepSpeed logs it (`epoch=.../micro_step=.../global_step=..., RunningAvgSamplesPerSec=...,
CurrSamplesPerSec=..., MemAllocated=...GB, MaxMemAllocated=...GB`).

The engine starts it at each forward and stops it at each step() (`global_step` at the
accumulation boundary), so a micro-step's time runs from its forward to its step() (DeepSpeed
starts it in its data loader's next() when it built the loader). The first `start_step`
global steps (warm-up) are counted but not timed: `start_time` stays 0 until then. A global
step's time is the sum of its micro-steps'; the running average divides the samples since
`start_step` by the time.

`timers.throughput.synchronized` waits for the device at each timed start and stop, so the
time covers the device's work; zerostream's default is false (DeepSpeed's is true), since a
wait at the forward's start would stall an optimizer update overlapped with it
(zerostream.overlap_step); without it a step is timed up to step()'s return, which has read
the gradient norm from the device (a wait of its own) in most runs.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional

from ..accelerator import get_accelerator

_EPSILON = 1e-6  # keeps the current rate finite for a step timed at 0 s

logger = logging.getLogger("zerostream")


def _allocated() -> tuple:
    """The device's allocated bytes and their peak (without a GPU: the process's resident
    memory and its high-water mark)."""
    accel = get_accelerator()
    return accel.memory_allocated(), accel.max_memory_allocated()


class ThroughputTimer:
    def __init__(
        self,
        config=None,
        batch_size: Optional[int] = None,
        start_step: int = 2,
        steps_per_output: Optional[int] = None,
        monitor_memory: bool = False,
        logging_fn: Optional[Callable[[str], None]] = None,
    ):
        if monitor_memory:
            raise NotImplementedError(
                "ThroughputTimer(monitor_memory=True): the virtual-memory and swap report is "
                "not implemented by zerostream"
            )
        self.config = config
        self.enabled = getattr(config, "enabled", True)
        self.synchronized = getattr(config, "synchronized", False)
        self.batch_size = 1 if batch_size is None else batch_size
        self.start_step = start_step
        self.steps_per_output = steps_per_output
        self.monitor_memory = monitor_memory
        self.logging = logging_fn or logger.info
        self.initialized = False
        self.started = False
        self.start_time = 0.0
        self.end_time = 0.0
        self.epoch_count = 0
        self.micro_step_count = 0
        self.global_step_count = 0
        self.total_elapsed_time = 0.0
        self.step_elapsed_time = 0.0

    def update_epoch_count(self) -> None:
        self.epoch_count += 1
        self.micro_step_count = 0

    def _sync(self) -> None:
        if self.synchronized:
            get_accelerator().synchronize()

    def start(self) -> None:
        if not self.enabled:
            return
        self.initialized = True
        self.started = True
        if self.global_step_count >= self.start_step:
            self._sync()
            self.start_time = time.time()

    def stop(self, global_step: bool = False, report_speed: bool = True) -> None:
        if not self.enabled or not self.started:
            return
        self.started = False
        self.micro_step_count += 1
        if global_step:
            self.global_step_count += 1
        if self.start_time <= 0:  # still warming up
            return
        self._sync()
        self.end_time = time.time()
        took = self.end_time - self.start_time
        self.total_elapsed_time += took
        self.step_elapsed_time += took
        if not global_step:
            return
        every = self.steps_per_output
        if report_speed and every and self.global_step_count % every == 0:
            now, peak = _allocated()
            self.logging(
                f"epoch={self.epoch_count}/micro_step={self.micro_step_count}/"
                f"global_step={self.global_step_count}, "
                f"RunningAvgSamplesPerSec={self.avg_samples_per_sec()}, "
                f"CurrSamplesPerSec={self.batch_size / (self.step_elapsed_time + _EPSILON)}, "
                f"MemAllocated={round(now / 1024**3, 2)}GB, "
                f"MaxMemAllocated={round(peak / 1024**3, 2)}GB"
            )
        self.step_elapsed_time = 0.0

    def avg_samples_per_sec(self) -> float:
        """Samples a second over the timed global steps (-inf before any)."""
        timed = self.global_step_count - self.start_step
        if self.global_step_count <= 0 or timed <= 0 or self.total_elapsed_time <= 0:
            return float("-inf")
        return self.batch_size / (self.total_elapsed_time / timed)
