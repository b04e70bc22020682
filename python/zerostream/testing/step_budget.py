"""Per-step budgets on the simulated device's counters (Note [The simulated device]).

A GPU step is slow for reasons no result shows: the host blocking on the compute stream to
read a value, a wait for a lane the host could have overlapped, memory registered again
every step (a page-lock costs milliseconds and synchronizes the device). The counters say
how often each happened; StepCounters takes their difference over each step, and check()
holds every step after the warm-up (where arenas are registered and plans made) to its
budget, naming the step, the counter and both numbers.
"""

from __future__ import annotations

from collections import Counter
from typing import Dict, List, Optional

from . import sim_device


class StepCounters:
    """The counters' change over each step: call step_done() after each engine.step()."""

    def __init__(self, sim: Optional["sim_device.SimDevice"] = None):
        self.sim = sim if sim is not None else sim_device.active()
        self.steps: List[Dict[str, int]] = []
        self.read_sites: List[Counter] = []  # per step: where the host read device memory
        self._last = dict(self.sim.counters) if self.sim is not None else {}
        self._last_sites = Counter(self.sim.read_sites) if self.sim is not None else Counter()

    def step_done(self) -> None:
        if self.sim is None:  # the plain CPU: nothing counted
            return
        now, sites = dict(self.sim.counters), Counter(self.sim.read_sites)
        self.steps.append({k: v - self._last.get(k, 0) for k, v in now.items()})
        self.read_sites.append(sites - self._last_sites)
        self._last, self._last_sites = now, sites

    def __repr__(self) -> str:
        steps = "; ".join(
            f"step {i + 1}: "
            + ", ".join(f"{k} {v}" for k, v in counts.items() if v)
            + (f" (reads at {dict(self.read_sites[i])})" if self.read_sites[i] else "")
            for i, counts in enumerate(self.steps)
        )
        return f"<StepCounters {steps or 'no step counted'}>"

    def __getstate__(self):
        """Sent between processes (a rank's result) without the device."""
        return {**self.__dict__, "sim": None}

    def over(self, warmup: int = 1, **budget: int) -> List[str]:
        """Each (step, counter) above its budget after the first `warmup` steps."""
        known = self.sim.counters if self.sim is not None else (self.steps or [{}])[0]
        unknown = sorted(set(budget) - set(known))
        if unknown:
            raise KeyError(f"step budget: no counter named {unknown}")
        return [
            f"step {i + 1}: {name} {counts[name]} > budget {limit}" + self._where(i, name)
            for i, counts in enumerate(self.steps)
            if i >= warmup
            for name, limit in budget.items()
            if counts[name] > limit
        ]

    def _where(self, step: int, name: str) -> str:
        if name not in ("host_reads", "blocking_downloads"):
            return ""
        sites = ", ".join(f"{site} x{n}" for site, n in self.read_sites[step].most_common())
        return f" (reads at {sites})"

    def check(self, warmup: int = 1, **budget: int) -> None:
        if len(self.steps) <= warmup:
            raise ValueError(f"step budget: {len(self.steps)} steps counted, none past warm-up")
        over = self.over(warmup, **budget)
        if over:
            raise AssertionError("the simulated device's step budget: " + "; ".join(over))
