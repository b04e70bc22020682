"""What the engine writes to the monitors, DeepSpeed's events:

- `Train/Samples/train_loss`: rank 0's loss of the step, the sum over its micro-steps of
  loss.mean() / gradient_accumulation_steps (the mean micro-batch loss when every backward
  scales by it), at the samples seen *before* the step (DeepSpeed wrote it in the boundary's
  backward, before the step counted its samples; its engine dropped the event in 0.18,
  #7665, zerostream keeps it);
- `Train/Samples/lr`: the first param group's lr after the step (the scheduler has stepped:
  the next step's lr), at the samples seen after the step;
- `Train/Samples/loss_scale`: with fp16, the loss scale after the step's update, there too;
- with `wall_clock_breakdown`, `Train/Samples/elapsed_time_ms_<phase>` for the phases
  forward, backward, backward_inner, backward_allreduce and step: the milliseconds each took
  over the step's micro-steps, at the samples seen after the step (engine/profiling.py).

Skipped (overflowed) steps write their events too, as DeepSpeed's do."""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import torch

from .base import writes_here
from .master import MonitorMaster


class EngineMonitor:
    """The engine's one handle on the monitors: `backward_seen` per backward,
    `step_ended` per optimizer step, `step_timed` per step with wall_clock_breakdown. Does
    nothing (and builds nothing) when no writer section is enabled."""

    def __init__(self, monitor_config):
        self.enabled = monitor_config.enabled
        self.master = MonitorMaster(monitor_config) if self.enabled else None
        self._loss: Optional[torch.Tensor] = None
        self._loss_samples = 0

    def backward_seen(self, loss: torch.Tensor, divisor: float, samples_seen: int) -> None:
        """A backward of `loss`, scaled by 1/`divisor` (gradient_accumulation_steps, or 1),
        with `samples_seen` samples in the steps before this one."""
        if not self.enabled:
            return
        mean = loss.detach().float().mean() / divisor
        self._loss = mean if self._loss is None else self._loss + mean
        self._loss_samples = samples_seen

    def step_ended(self, samples_seen: int, lrs: Sequence[float], loss_scale=None) -> None:
        """An optimizer step ended (applied or skipped); `samples_seen` counts it."""
        if not self.enabled:
            return
        loss, self._loss = self._loss, None
        if not writes_here():
            return
        events = []
        if loss is not None:
            events.append(("Train/Samples/train_loss", loss.item(), self._loss_samples))
        if lrs:
            events.append(("Train/Samples/lr", lrs[0], samples_seen))
        if loss_scale is not None:
            events.append(("Train/Samples/loss_scale", loss_scale, samples_seen))
        self.master.write_events(events)

    def step_timed(self, samples_seen: int, phase_ms: Mapping[str, float]) -> None:
        """The step's time per phase (milliseconds; keys: DeepSpeed's event suffixes)."""
        if not self.enabled or not writes_here():
            return
        self.master.write_events(
            [
                (f"Train/Samples/elapsed_time_ms_{phase}", ms, samples_seen)
                for phase, ms in phase_ms.items()
            ]
        )

    def close(self) -> None:
        if self.master is not None:
            self.master.close()
