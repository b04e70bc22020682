"""What "auto" expects of the steps after it places its tiers, for its log line and for
`bench capacity` to hold against the measured steps (Note [Predicting the placed step] in
the package docstring). Pure functions of one measured step."""

from __future__ import annotations

import time
from typing import Any, Optional

from ..memory_preflight import skewed


def predict_step(
    forward_backward_s: float,
    optimizer_s: float,
    optimizer_wait_s: float,
    disk_bytes_before: int,
    disk_bytes_after: int,
) -> dict:
    """The step time "auto" expects once its tiers are placed (Note [Predicting the placed
    step]): the forward and backward as just measured, plus the last optimizer step scaled
    by the disk bytes it will move against those it moved, never below the part of it that
    did not wait on the disk."""
    scale = disk_bytes_after / disk_bytes_before if disk_bytes_before > 0 else 1.0
    optimizer_after = max(optimizer_s * scale, optimizer_s - optimizer_wait_s)
    return {
        "forward_backward_seconds": round(forward_backward_s, 3),
        "last_optimizer_step_seconds": round(optimizer_s, 3),
        "optimizer_wait_seconds": round(optimizer_wait_s, 3),
        "optimizer_disk_bytes_before": int(disk_bytes_before),
        "optimizer_disk_bytes_after": int(disk_bytes_after),
        "predicted_optimizer_step_seconds": round(optimizer_after, 3),
        "predicted_step_seconds": round(forward_backward_s + optimizer_after, 3),
    }


def predict_peak_rss(
    rss_bytes: Optional[int], excess_bytes: int, placed_bytes: int, budget_bytes: Optional[int]
) -> dict:
    """The placed steps' peak RSS "auto" expects (Note [Predicting the placed step]): the RSS
    it placed at, plus what it placed, plus the measured step's excess; and the ceiling it
    allowed itself (the RSS plus the excess plus the whole budget: what leaves only the
    reserve; none where no budget was read). {} where the RSS could not be read."""
    if rss_bytes is None:
        return {}
    out = {
        "rss_at_placement_bytes": int(rss_bytes),
        "step_excess_bytes": int(excess_bytes),
        "placed_bytes": int(placed_bytes),
        "predicted_peak_rss_bytes": int(rss_bytes + excess_bytes + placed_bytes),
    }
    if budget_bytes is not None:
        out["host_ceiling_bytes"] = int(rss_bytes + excess_bytes + budget_bytes)
    return out


class StepClock:
    """One sub-grouped optimizer's measured steps, what its prediction is made from (Note
    [Predicting the placed step]): `begin()` as step() starts, before any placement (it
    ends the interval since the last step's end: the forward and backward), `open(...)` and
    `close(...)` around the update with the tier's disk byte and wait counters."""

    def __init__(self) -> None:
        self.steps = 0  # steps this process ran (the first one is the measurement)
        self._started: Optional[float] = None
        self.ended = 0.0  # perf_counter at the last update's end
        self.last_interval = 0.0  # seconds from one step() to the next: a whole iteration
        self.forward_backward_s = 0.0  # from the end of one step() to the start of the next
        self.seconds = 0.0  # the last update's
        self.disk_bytes = 0  # state read and written, and shards written, by it
        self.shard_bytes = 0  # the parameter shards it wrote
        self.wait = 0.0  # its unhidden wait on the disk
        self._marks = (0.0, 0, 0, 0.0)

    def begin(self) -> None:
        now = time.perf_counter()
        if self._started is not None:
            self.last_interval = now - self._started
            self.forward_backward_s = now - self.ended
        self._started = now

    def open(self, moved_bytes: int, shard_bytes: int, wait_s: float) -> None:
        """The update starts; the counters as they are now."""
        self.steps += 1
        self._marks = (time.perf_counter(), moved_bytes, shard_bytes, wait_s)

    def close(self, moved_bytes: int, shard_bytes: int, wait_s: float) -> None:
        """The update ended: its seconds, bytes and wait from the counters' growth."""
        started, moved0, shards0, wait0 = self._marks
        self.wait = skewed(wait_s - wait0, "optimizer_wait")
        self.ended = time.perf_counter()
        self.seconds = self.ended - started
        self.shard_bytes = shard_bytes - shards0
        self.disk_bytes = moved_bytes - moved0 + self.shard_bytes

    def predict(self, state_disk_bytes: int, shards_move: Optional[Any] = None) -> dict:
        """predict_step for a placement that leaves `state_disk_bytes` of optimizer state to
        read and write per step; `shards_move` (the placer's Move), if the shards moved into
        host memory since the last update, is not a step's cost, and the next update writes
        only the shards still on disk."""
        fb, shard_bytes = self.forward_backward_s, self.shard_bytes
        if shards_move is not None and shards_move.ended_at > self.ended:
            fb -= shards_move.seconds
            shard_bytes = int(shard_bytes * shards_move.disk_share_after)
        return predict_step(
            max(0.0, fb), self.seconds, self.wait, self.disk_bytes, state_disk_bytes + shard_bytes
        )
