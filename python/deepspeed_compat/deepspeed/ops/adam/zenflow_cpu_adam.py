"""`deepspeed.ops.adam.ZenFlowCPUAdam`: DeepSpeedCPUAdam whose step takes the step number
(`step(step_id)`: every param updates as step `step_id`, bias correction included), as
ZenFlow's host update numbers its steps by the training step. With overlap_step DeepSpeed
drives the update from its optimizer process and this object's step is the plain one."""

from __future__ import annotations

import torch

from zerostream.ops.adam import DeepSpeedCPUAdam


class ZenFlowCPUAdam(DeepSpeedCPUAdam):
    def __init__(self, *args, overlap_step: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.overlap_step = overlap_step
        if not overlap_step:
            self.step = self._sequential_step

    @torch.no_grad()
    def _sequential_step(self, step_id: int, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if self._grad(p) is not None:
                    self.set_step(p, step_id - 1)
        DeepSpeedCPUAdam.step(self)
        return loss


__all__ = ["ZenFlowCPUAdam"]
