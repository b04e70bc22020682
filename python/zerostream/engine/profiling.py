"""The engine's profiling, DeepSpeed's: `wall_clock_breakdown` times every forward, backward
(its autograd, `backward_inner`, and its gradient hand-off, `backward_allreduce`, timed by
the stage, zero/base.py) and step; after each step() rank 0 prints the micro-step timers,
and at each accumulation boundary the step's timers, which the monitors get as
`Train/Samples/elapsed_time_ms_<phase>` (Note [Timers and device syncs] in
profiling/timers.py). The throughput timer (`tput_timer`, profiling/throughput.py) runs
from each forward to its step() and logs samples per second every `steps_per_print` steps.
The `flops_profiler` profiles rank 0's forwards at global step `profile_step` and prints
the profile in the step() that follows.

A collaborator the engine holds: it reads the counters and ranks records and writes to the
engine's monitor; the engine's DeepSpeed accessors of these sections call it."""

from __future__ import annotations

import contextlib
from typing import Dict, Iterator, Optional

from ..config import DeepSpeedConfig
from ..monitor import EngineMonitor
from ..profiling import FlopsProfiler, PhaseTimers
from ..profiling.throughput import ThroughputTimer
from ..profiling.timers import PHASES
from .records import EngineCounters, Ranks


class EngineProfiling:
    def __init__(
        self,
        config: DeepSpeedConfig,
        counters: EngineCounters,
        ranks: Ranks,
        monitor: EngineMonitor,
        phases: PhaseTimers,
        flops_profiler: Optional[FlopsProfiler],
    ):
        self._wall_clock = config.wall_clock_breakdown
        self._flops = config.flops_profiler
        self._counters = counters
        self._ranks = ranks
        self._monitor = monitor
        self.phases = phases
        self.flops_profiler = flops_profiler
        self._cache: Dict[str, float] = {}
        # DeepSpeed's engine.tput_timer: started at each forward, stopped at each step().
        self.tput_timer = ThroughputTimer(
            config.timers.throughput,
            batch_size=config.train_batch_size,
            steps_per_output=config.steps_per_print,
        )

    # --- DeepSpeed's accessors ---------------------------------------------------------------
    def wall_clock_breakdown(self) -> bool:
        return self._wall_clock

    def flops_profiler_enabled(self) -> bool:
        return self._flops.enabled

    def flops_profiler_recompute_fwd_factor(self) -> float:
        return self._flops.recompute_fwd_factor

    def flops_profiler_profile_step(self) -> int:
        return self._flops.profile_step

    def flops_profiler_module_depth(self) -> int:
        return self._flops.module_depth

    def flops_profiler_top_modules(self) -> int:
        return self._flops.top_modules

    def flops_profiler_detailed(self) -> bool:
        return self._flops.detailed

    def flops_profiler_output_file(self) -> Optional[str]:
        return self._flops.output_file

    def get_wall_clock_timers(self) -> Dict[str, float]:
        """The milliseconds of every timer as the last step() left them, before they were
        printed and reset (empty without wall_clock_breakdown)."""
        return self._cache

    # --- the loop's phases -----------------------------------------------------------------
    def _profiling_now(self) -> Optional[FlopsProfiler]:
        """The flops profiler when this forward or step is the profiled one, else None."""
        if self._counters.global_steps != self._flops.profile_step or self._ranks.global_rank:
            return None
        return self.flops_profiler

    @contextlib.contextmanager
    def forward(self) -> Iterator[None]:
        profiler = self._profiling_now()
        if profiler is not None:
            profiler.start_profile(ignore_list=None)
        self.tput_timer.start()
        try:
            with self.phases.span("forward"):
                yield
        finally:
            if profiler is not None:
                profiler.stop_profile()

    def backward(self):
        return self.phases.span("backward")

    @contextlib.contextmanager
    def step(self, boundary: bool) -> Iterator[None]:
        """Around one step() call (`boundary`: it ends the accumulation window). What it
        reports afterwards is skipped when the step raised."""
        profiler = self._profiling_now()
        with self.phases.span("step"):
            yield
        self.tput_timer.stop(global_step=boundary, report_speed=self._ranks.global_rank == 0)
        if profiler is not None:
            profiler.print_model_profile(
                profile_step=self._counters.global_steps,
                module_depth=self._flops.module_depth,
                top_modules=self._flops.top_modules,
                detailed=self._flops.detailed,
                output_file=self._flops.output_file,
            )
            profiler.end_profile()
        if not self._wall_clock:
            return
        timers = self.phases.timers
        self._cache = {n: timers(n).elapsed(reset=False) for n in self.phases.active_timers()}
        timers.log(self.phases.micro_timers)
        if boundary:
            self._monitor.step_timed(
                self._counters.global_samples,
                {phase: self._cache[whole] for phase, (_, whole) in PHASES.items()},
            )
            timers.log(self.phases.global_timers)
