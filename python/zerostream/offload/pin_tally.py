"""A running total of host memory pinned through the accelerator's ``pin_memory``
(DeepSpeed's pinned-memory tracker): bytes and calls, with an INFO line each time the total
first reaches 32 GB, 64 GB, 128 GB, ... (doubling keeps the lines few). Page-locked memory
cannot be swapped out and counts against ``ulimit -l``, so the total explains host
out-of-memory errors that surface far from the calls that pinned it.

It counts what was asked to be pinned; a tensor's memory leaving (unpin, garbage
collection) is not subtracted, as in DeepSpeed: the live figure is the locked tensors'
(offload/locked_tensors.py, ``stats()``).
"""

from __future__ import annotations

import logging

_GB = 1024**3
FIRST_CHECKPOINT = 32 * _GB


def fmt_bytes(num_bytes: int) -> str:
    """512 B, 2.0 KB, 1.00 MB, 1.000 GB (DeepSpeed's spelling)."""
    for unit, digits, name in ((_GB, 3, "GB"), (1 << 20, 2, "MB"), (1 << 10, 1, "KB")):
        if num_bytes >= unit:
            return f"{num_bytes / unit:.{digits}f} {name}"
    return f"{num_bytes} B"


class PinnedMemoryTracker:
    """Bytes and calls pinned so far in this process, reported to `logger`."""

    def __init__(self, logger: logging.Logger):
        self.logger = logger  # where the lines go (the compat package names it "DeepSpeed")
        self.reset()

    def reset(self) -> None:
        self._bytes = 0
        self._calls = 0
        self._next_checkpoint = FIRST_CHECKPOINT

    def track(self, num_bytes: int) -> None:
        if isinstance(num_bytes, bool) or not isinstance(num_bytes, int) or num_bytes < 0:
            raise ValueError(
                f"track_pinned_memory: num_bytes must be an int >= 0; got {num_bytes!r}"
            )
        self._bytes += num_bytes
        self._calls += 1
        self.logger.debug(
            "pin_memory: +%s (call #%d, running total: %s)",
            fmt_bytes(num_bytes), self._calls, fmt_bytes(self._bytes),
        )  # fmt: skip
        while self._bytes >= self._next_checkpoint:
            self.logger.info(
                "[pinned-memory checkpoint] crossed %s: %s pinned across %d allocations",
                fmt_bytes(self._next_checkpoint), fmt_bytes(self._bytes), self._calls,
            )  # fmt: skip
            self._next_checkpoint *= 2

    def log_summary(self, tag: str = "") -> None:
        prefix = f"[pinned-memory {tag}] " if tag else "[pinned-memory] "
        self.logger.info(
            "%s%s pinned across %d allocations", prefix, fmt_bytes(self._bytes), self._calls
        )


_TALLY = PinnedMemoryTracker(logging.getLogger("zerostream"))


def tally() -> PinnedMemoryTracker:
    """The process's tally, which the accelerator's ``pin_memory`` adds to."""
    return _TALLY


__all__ = ["FIRST_CHECKPOINT", "PinnedMemoryTracker", "fmt_bytes", "tally"]
