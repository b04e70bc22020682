"""The measuring window of "auto" placement: what a step needs above what it leaves, measured
over whole steps (Note [A step's excess]). One StepWindow per stage optimizer (its tiers
register while they wait to be placed; the engine closes it after each step through the
stage's `after_step`), so two engines in one process keep their own measurements.

The process's peak RSS (VmHWM) is the kernel's, one per process: restarting it is the
module's business (restart_window_peak), and the peak from before any restart is kept here
for the benchmarks (process_peak_bytes).

Note [A step's excess]
  "auto" sizes its host tiers from the excess of a step: its peak RSS less the RSS it
  leaves (the gathered parameters stage3_max_reuse_distance keeps across the end of
  forward, prefetches, activations, staging). The process's VmHWM less VmRSS measures it
  only until a placement raises the RSS: after the optimizer state's arena filled, the
  3.17 B run's parameter shards were sized from a 0.25 GiB excess where the step needed
  2 GiB. So while a tier waits to be placed (`waiting`), each step closes the window
  (step_ended: the excess is noted and VmHWM restarts), and excess() is the larger of the
  last whole step's and the one under way's.

  The excess is the peak less the RSS at the step's end, so a placement must read the RSS
  and the usable memory at a point that holds what a step's end holds. With
  `host_malloc: "retain"` a step's end gives the free heap back before its window closes,
  but a placement comes later, inside the next step, after the heap has grown back: the
  3.17 B tiered bench placed with 13.06 GiB resident and MemAvailable 9.96 GiB, both
  counting ~5 GiB of regrown free heap, beside an excess of 6.52 GiB that is that heap
  again, and predicted a peak of 21.46 GiB for steps that peaked at 17.21
  (benchmarks/capacity.md). So a tier calls before_placing() before it reads memory:
  "retain" gives the free heap back there too. The room the retained heap then takes is
  counted once, explicitly (budgets.measured_budget_bytes).
"""

from __future__ import annotations

import weakref
from typing import Optional

from ... import host_malloc
from ..memory_preflight import memory_status, restart_peak, skewed

_peak_before = 0  # the highest VmHWM a restart discarded (the process's, for benchmarks)


def restart_window_peak() -> Optional[int]:
    """Restarts VmHWM (its value kept in the process's peak) and returns the peak of the
    window it closed; None where /proc does not say or refuses."""
    global _peak_before
    peak = memory_status().get("VmHWM")
    if peak is None or not restart_peak():
        return None
    _peak_before = max(_peak_before, peak)
    return peak


def process_peak_bytes() -> Optional[int]:
    """The process's peak RSS across the windows' restarts (None where /proc does not say)."""
    peak = memory_status().get("VmHWM")
    return None if peak is None else max(peak, _peak_before)


def forget_process_peak() -> None:
    """The benchmarks restart the process's peak: the one kept from before goes too."""
    global _peak_before
    _peak_before = 0


class StepWindow:
    """One stage optimizer's measuring window (Note [A step's excess])."""

    def __init__(self) -> None:
        self.waiting: "weakref.WeakSet" = weakref.WeakSet()  # the tiers still to be placed
        self.last_excess: Optional[int] = None  # the last whole step's (None: none measured)
        self.windows = 0  # steps measured

    @staticmethod
    def heap_retained() -> bool:
        """Whether host_malloc "retain" keeps freed heap resident now (a budget leaves that
        heap out: budgets.measured_budget_bytes)."""
        return host_malloc.holders() > 0

    @staticmethod
    def before_placing() -> None:
        """A tier is about to read the RSS and the usable memory to place itself: the free
        heap a retained step grew back goes first (Note [A step's excess])."""
        host_malloc.give_back_for_placement()

    def wait_for_me(self, tier: object) -> None:
        self.waiting.add(tier)

    def done(self, tier: object) -> None:
        self.waiting.discard(tier)

    def step_ended(self) -> None:
        """An optimizer step is over: "retain" settles its heap (Note [Fresh pages cost
        more than the math] in host_malloc.py), then the window closes if a tier waits."""
        host_malloc.settle(bool(self.waiting), self.last_excess)
        if not self.waiting:
            return
        rss = memory_status().get("VmRSS")
        if rss is None:
            return
        peak = restart_window_peak()
        if peak is not None:
            self.last_excess = max(0, peak - rss)
            self.windows += 1

    def excess(self) -> int:
        """The larger of the last whole step's excess and that of the step under way (before
        any window closed: since the process began, which errs on the large side, never the
        small: the process's peak may predate the steps)."""
        status = memory_status()
        if "VmHWM" not in status or "VmRSS" not in status:
            return self.last_excess or 0
        return skewed(max(self.last_excess or 0, status["VmHWM"] - status["VmRSS"]), "excess")
