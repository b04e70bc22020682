"""DeepSpeed's wall-clock timers (`deepspeed.utils.timer`): named timers that add up the
spans between start() and stop() until read with elapsed(), and the engine's phases timed
with them when `wall_clock_breakdown` is on (`PhaseTimers`, DeepSpeed's EngineTimers).

Note [Timers and device syncs]
  On a GPU a span is the device's time between two CUDA events recorded on the current
  stream at start() and stop(); recording an event does not wait for the device. Reading a
  timer (elapsed()) waits for its last stop event. The engine reads its timers once per
  step only when wall_clock_breakdown is on; with it off no timer is started or read, so
  a run without wall_clock_breakdown gains no device sync per step. On the CPU spans are
  the host's clock.
"""

from __future__ import annotations

import contextlib
import time
from typing import Dict, Iterable, Iterator, List, Optional

import torch

from ..comm.comms_logging import trim_mean

# DeepSpeed's timer names: *_MICRO per micro-step (reset every step() call), *_GLOBAL per
# optimizer step (reset at each gradient accumulation boundary).
FORWARD_MICRO_TIMER = "fwd_microstep"
FORWARD_GLOBAL_TIMER = "fwd"
BACKWARD_MICRO_TIMER = "bwd_microstep"
BACKWARD_GLOBAL_TIMER = "bwd"
BACKWARD_INNER_MICRO_TIMER = "bwd_inner_microstep"
BACKWARD_INNER_GLOBAL_TIMER = "bwd_inner"
BACKWARD_REDUCE_MICRO_TIMER = "bwd_allreduce_microstep"
BACKWARD_REDUCE_GLOBAL_TIMER = "bwd_allreduce"
STEP_MICRO_TIMER = "step_microstep"
STEP_GLOBAL_TIMER = "step"

# The engine's phases and their (micro, global) timers.
PHASES = {
    "forward": (FORWARD_MICRO_TIMER, FORWARD_GLOBAL_TIMER),
    "backward": (BACKWARD_MICRO_TIMER, BACKWARD_GLOBAL_TIMER),
    "backward_inner": (BACKWARD_INNER_MICRO_TIMER, BACKWARD_INNER_GLOBAL_TIMER),
    "backward_allreduce": (BACKWARD_REDUCE_MICRO_TIMER, BACKWARD_REDUCE_GLOBAL_TIMER),
    "step": (STEP_MICRO_TIMER, STEP_GLOBAL_TIMER),
}


def _use_events() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


class _Span:
    """One start..stop: host seconds, or two CUDA events (Note [Timers and device syncs])."""

    def __init__(self, events: bool) -> None:
        self.start_event: Optional[torch.cuda.Event] = None
        self.stop_event: Optional[torch.cuda.Event] = None
        self.start_time = self.stop_time = 0.0
        if events:
            self.start_event = torch.cuda.Event(enable_timing=True)
            self.start_event.record()
        else:
            self.start_time = time.perf_counter()

    def stop(self) -> None:
        if self.start_event is not None:
            self.stop_event = torch.cuda.Event(enable_timing=True)
            self.stop_event.record()
        else:
            self.stop_time = time.perf_counter()

    def milliseconds(self) -> float:
        if self.start_event is not None and self.stop_event is not None:
            self.stop_event.synchronize()
            return self.start_event.elapsed_time(self.stop_event)
        return 1000.0 * (self.stop_time - self.start_time)


class SynchronizedWallClockTimer:
    """DeepSpeed's group of named timers: `timers(name)` makes or finds one."""

    class Timer:
        def __init__(self, name: str) -> None:
            self.name_ = name
            self.started_ = False
            self._spans: List[_Span] = []
            self._open: Optional[_Span] = None
            self.elapsed_records: Optional[List[float]] = None

        def start(self) -> None:
            if self.started_:
                raise RuntimeError(f"timer {self.name_!r}: start() while it runs")
            self._open = _Span(_use_events())
            self.started_ = True

        def stop(self, reset: bool = False, record: bool = False) -> None:
            """Ends the running span (`reset`, `record`: accepted as DeepSpeed's are)."""
            if not self.started_ or self._open is None:
                raise RuntimeError(f"timer {self.name_!r}: stop() while it is not running")
            self._open.stop()
            self._spans.append(self._open)
            self._open = None
            self.started_ = False

        def reset(self) -> None:
            self.started_ = False
            self._open = None
            self._spans.clear()
            self.elapsed_records = None

        def elapsed(self, reset: bool = True) -> float:
            """Milliseconds over the spans since the last reset (a running span counts up to
            now and goes on running)."""
            running = self.started_
            if running:
                self.stop()
            self.elapsed_records = [s.milliseconds() for s in self._spans]
            total = sum(self.elapsed_records)
            if reset:
                self.reset()
            if running:
                self.start()
            return total

        def mean(self) -> float:
            """The spans' mean in milliseconds, the top and bottom 10% left out."""
            self.elapsed(reset=False)
            return trim_mean(self.elapsed_records or [], 0.1)

    def __init__(self) -> None:
        self.timers: Dict[str, SynchronizedWallClockTimer.Timer] = {}

    def __call__(self, name: str) -> "SynchronizedWallClockTimer.Timer":
        if name not in self.timers:
            self.timers[name] = self.Timer(name)
        return self.timers[name]

    def get_timers(self) -> dict:
        return self.timers

    def log(self, names, normalizer=1.0, reset=True, memory_breakdown=False, ranks=None) -> None:
        """Prints "time (ms) | name: ms | ..." for the timers in `names` that exist, on the
        ranks in `ranks` (default rank 0)."""
        if normalizer <= 0:
            raise ValueError(f"timers.log: normalizer must be > 0; got {normalizer}")
        parts = [
            f"{name}: {self.timers[name].elapsed(reset=reset) / normalizer:.2f}"
            for name in names
            if name in self.timers
        ]
        _print_on_ranks(" | ".join(["time (ms)"] + parts), ranks or [0])

    def get_mean(self, names, normalizer=1.0, reset=True) -> Dict[str, float]:
        if normalizer <= 0:
            raise ValueError(f"timers.get_mean: normalizer must be > 0; got {normalizer}")
        return {
            name: self.timers[name].mean() * 1000.0 / normalizer
            for name in names
            if name in self.timers
        }


class NoopTimer:
    """DeepSpeed's timer group that times nothing (every timer reads 0)."""

    class Timer:
        def start(self) -> None: ...

        def reset(self) -> None: ...

        def stop(self, **kwargs) -> None: ...

        def elapsed(self, **kwargs) -> float:
            return 0

        def mean(self) -> float:
            return 0

    def __init__(self) -> None:
        self.timer = self.Timer()

    def __call__(self, name: str) -> "NoopTimer.Timer":
        return self.timer

    def get_timers(self) -> dict:
        return {}

    def log(
        self, names, normalizer=1.0, reset=True, memory_breakdown=False, ranks=None
    ) -> None: ...

    def get_mean(self, names, normalizer=1.0, reset=True) -> None: ...


def _print_on_ranks(message: str, ranks: Iterable[int]) -> None:
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    wanted = list(ranks)
    if -1 in wanted or rank in wanted:
        print(f"[Rank {rank}] {message}", flush=True)


class PhaseTimers:
    """The engine's phase timers (DeepSpeed's EngineTimers): each phase starts and stops its
    micro-step timer and its step timer when `enabled` (wall_clock_breakdown), nothing
    otherwise. `timers` is the engine's SynchronizedWallClockTimer."""

    def __init__(self, timers: SynchronizedWallClockTimer, enabled: bool) -> None:
        self.timers = timers
        self.enabled = enabled
        self.micro_timers = [micro for micro, _ in PHASES.values()] if enabled else []
        self.global_timers = [whole for _, whole in PHASES.values()] if enabled else []

    def active_timers(self) -> List[str]:
        return self.micro_timers + self.global_timers

    @contextlib.contextmanager
    def span(self, phase: str) -> Iterator[None]:
        """Times the body as `phase` (a key of PHASES)."""
        if not self.enabled:
            yield
            return
        names = PHASES[phase]
        for name in names:
            self.timers(name).start()
        try:
            yield
        finally:
            for name in names:
                self.timers(name).stop()


NULL_PHASE_TIMERS = PhaseTimers(SynchronizedWallClockTimer(), enabled=False)
