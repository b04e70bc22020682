"""Per-step breakdown printed every `steps_per_print` steps: where the time went (forward,
backward, gradient reduction, optimizer step, and the part of the step spent waiting for swap
I/O) and how many bytes moved over each tier (collectives, NVMe reads and writes), with the
rates they were moved at."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Dict


class StepTelemetry:
    """Counters since the engine was built (never reset, so a caller may difference them over
    any window it likes); `report()` prints the window since its previous call.

    `issue_timed` (the engine runs on a GPU): phases and the collectives are timed on the
    host, which on a GPU measures how long issuing the work took, not how long it ran (the
    host goes on while the GPU works). The report says so instead of printing a collective's
    rate as if it were the link's. The copy lanes' d2h/h2d seconds are measured with events on
    the lanes, and NVMe I/O and the CPU optimizer run on the host: those are real times."""

    PHASES = ("forward", "backward", "reduce", "step", "swap_wait")
    # A collective's tier is its kind; its bytes are the whole gathered or reduced tensor
    # (what estimate/plan.py's link model counts per step), on every rank.
    COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce")
    ISSUE_TIMED_TIERS = COLLECTIVES

    def __init__(self, issue_timed: bool = False):
        self.issue_timed = issue_timed
        self.seconds: Dict[str, float] = defaultdict(float)
        self.bytes: Dict[str, int] = defaultdict(int)  # tier -> bytes moved
        self.tier_seconds: Dict[str, float] = defaultdict(float)
        self.calls: Dict[str, int] = defaultdict(int)  # tier -> transfers that moved bytes
        self.steps = 0
        self._window = self.snapshot()

    def snapshot(self) -> dict:
        """The counters now, as plain dicts."""
        return {
            "seconds": dict(self.seconds),
            "bytes": dict(self.bytes),
            "tier_seconds": dict(self.tier_seconds),
            "calls": dict(self.calls),
            "steps": self.steps,
        }

    @contextmanager
    def phase(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start

    def moved(self, tier: str, nbytes: int, seconds: float) -> None:
        self.bytes[tier] += int(nbytes)
        self.tier_seconds[tier] += seconds
        if nbytes:
            self.calls[tier] += 1

    def add_seconds(self, phase: str, seconds: float) -> None:
        self.seconds[phase] += seconds

    def report(self) -> str:
        """One line for the window since the last report, then starts a new window."""
        now, then = self.snapshot(), self._window
        self._window = now
        win = {
            key: {k: v - then[key].get(k, 0) for k, v in now[key].items()}
            for key in ("seconds", "bytes", "tier_seconds")
        }
        steps = now["steps"] - then["steps"]
        n = max(1, steps)
        parts = [f"{p} {1000 * win['seconds'].get(p, 0.0) / n:.1f} ms" for p in self.PHASES]
        for tier in sorted(t for t, b in win["bytes"].items() if b):
            mib = win["bytes"][tier] / n / 2**20
            secs = win["tier_seconds"].get(tier, 0.0)
            rate = f"{win['bytes'][tier] / secs / 1e9:.2f} GB/s" if secs > 0 else "n/a"
            if self.issue_timed and tier in self.ISSUE_TIMED_TIERS:
                rate = f"issued at {rate}"
            parts.append(f"{tier} {mib:.2f} MiB ({rate})")
        head = f"per step over {steps} steps"
        if self.issue_timed:
            head += " (phases and comm: host issue time, the GPU may still be running)"
        return head + " | " + " | ".join(parts)


class NullTelemetry:
    """StepTelemetry's interface doing nothing: components hold one of the two and never
    branch on whether telemetry is on."""

    PHASES = StepTelemetry.PHASES

    def phase(self, name: str):
        return contextlib.nullcontext()

    def moved(self, tier: str, nbytes: int, seconds: float) -> None:
        pass

    def add_seconds(self, phase: str, seconds: float) -> None:
        pass


NULL_TELEMETRY = NullTelemetry()
