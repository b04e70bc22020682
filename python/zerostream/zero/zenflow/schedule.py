"""When ZenFlow selects columns and when the host update runs: DeepSpeed's rules
(deepspeed/runtime/zenflow/engine.py and zenflow_stage_1_and_2.py) over the step number t,
counted from 0 (DeepSpeed's micro_step: one per backward and step, as ZenFlow runs with
gradient_accumulation_steps 1 and makes each step its own micro-batch).

- Steps t < full_warm_up_rounds are warm-up: every one ends in a whole host update, nothing is
  selected.
- A selection step re-picks the important columns: the first step after warm-up, then every
  step divisible by the resolved select_interval (0: never again).
- An update step ends an interval: the warm-up steps, every update_interval-th step after
  warm-up, and the step before each selection step (so a selection starts on a fresh
  accumulation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ...config.zenflow import ZenFlowConfig

_PATH = "zero_optimization.zenflow"


@dataclass(frozen=True)
class ZenFlowSchedule:
    update_interval: int
    select_interval: int  # in steps; 0: select once, when warm-up ends
    warm_up: int

    def selects(self, t: int) -> bool:
        if t < self.warm_up:
            return False
        return t == self.warm_up or (self.select_interval != 0 and t % self.select_interval == 0)

    def updates(self, t: int) -> bool:
        if t + 1 < self.warm_up:
            return True
        if (t + 1 - self.warm_up) % self.update_interval == 0:
            return True
        return self.select_interval != 0 and (t + 1) % self.select_interval == 0

    def selective(self, t: int) -> bool:
        """Whether step t updates the selected columns on the device."""
        return t >= self.warm_up


def resolve_schedule(z: ZenFlowConfig, steps_per_epoch: Optional[int] = None) -> ZenFlowSchedule:
    """DeepSpeed's engine-time rules: select_strategy "auto" is "epoch" with an interval of one
    epoch (an explicit select_interval conflicts with it); "step" and "epoch" need a number;
    an "epoch" interval counts epochs of `steps_per_epoch` steps (unknown: select once); the
    interval may not be shorter than update_interval."""
    if isinstance(z.update_interval, str):
        raise NotImplementedError(
            f'{_PATH}.update_interval: "auto" (an interval adapted from the gradients with '
            "auto_ratio) is not implemented by zerostream; give an integer"
        )
    strategy, interval = z.select_strategy, z.select_interval
    if strategy == "auto":
        if not isinstance(interval, str):
            raise ValueError(
                f'{_PATH}.select_interval: {interval} conflicts with select_strategy "auto", '
                "which selects once an epoch (DeepSpeed raises here too); remove it or set "
                'select_strategy to "step" or "epoch"'
            )
        strategy, interval = "epoch", 1
    elif isinstance(interval, str):
        raise ValueError(
            f'{_PATH}.select_interval: must be an integer with select_strategy "{strategy}"; '
            f"got {interval!r}"
        )
    epoch = z.steps_per_epoch if steps_per_epoch is None else steps_per_epoch
    if strategy == "epoch":
        interval = interval * epoch if epoch else 0
    if interval != 0 and interval < z.update_interval:
        raise ValueError(
            f"{_PATH}.select_interval: {interval} steps is shorter than update_interval "
            f"({z.update_interval}); it must be at least that"
        )
    return ZenFlowSchedule(z.update_interval, interval, z.full_warm_up_rounds)
