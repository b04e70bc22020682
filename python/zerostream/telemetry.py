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
    PHASES = ("forward", "backward", "reduce", "step", "swap_wait")

    def __init__(self):
        self.seconds: Dict[str, float] = defaultdict(float)
        self.bytes: Dict[str, int] = defaultdict(int)  # tier -> bytes moved
        self.tier_seconds: Dict[str, float] = defaultdict(float)
        self.steps = 0

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

    def add_seconds(self, phase: str, seconds: float) -> None:
        self.seconds[phase] += seconds

    def report(self) -> str:
        """One line for the window since the last report, then starts a new window."""
        n = max(1, self.steps)
        parts = [f"{p} {1000 * self.seconds[p] / n:.1f} ms" for p in self.PHASES]
        for tier in sorted(self.bytes):
            mib = self.bytes[tier] / n / 2**20
            secs = self.tier_seconds[tier]
            rate = f"{self.bytes[tier] / secs / 1e9:.2f} GB/s" if secs > 0 else "n/a"
            parts.append(f"{tier} {mib:.2f} MiB ({rate})")
        line = f"per step over {self.steps} steps | " + " | ".join(parts)
        self.seconds.clear()
        self.bytes.clear()
        self.tier_seconds.clear()
        self.steps = 0
        return line


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
