"""The device-side update of the selected columns: Adam on W[:, selected] (and on 1-D
parameters whole) every step, with moments of the selected shape.

As DeepSpeed's ZenFlowSelectiveAdamW: the moments live in the parameter's dtype, are zeroed
(not dropped) when a new selection starts, and the step count runs on across selections (the
bias correction does not restart). Hyperparameters are the run's optimizer's param group's
at each step (lr as the schedule sets it, betas, eps, weight_decay, AdamW or L2 Adam as the
host side); DeepSpeed builds this optimizer from the config's optimizer params with torch
AdamW's defaults for the keys left out (weight_decay 0.01 where its host Adam uses 0), so
the two sides agree here where DeepSpeed's may not. `offload` (zenflow.offload) keeps the
moments in host memory between steps.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import torch
from torch.optim.adam import adam as _adam
from torch.optim.adamw import adamw as _adamw


class _Moments:
    __slots__ = ("exp_avg", "exp_avg_sq", "step")

    def __init__(self, like: torch.Tensor, where: torch.device):
        self.exp_avg = torch.zeros(like.shape, dtype=like.dtype, device=where)
        self.exp_avg_sq = torch.zeros(like.shape, dtype=like.dtype, device=where)
        self.step = torch.zeros((), dtype=torch.float32)


class SelectiveAdam:
    def __init__(self, adamw_mode: bool, offload: bool):
        self.adamw_mode = adamw_mode
        self.offload = offload
        self.state: Dict[int, _Moments] = {}  # by parameter index (ColumnSelector.pieces)

    def clear(self) -> None:
        """A new selection: the moments restart from zero."""
        for m in self.state.values():
            m.exp_avg.zero_()
            m.exp_avg_sq.zero_()

    @torch.no_grad()
    def step(
        self,
        params: List[torch.Tensor],
        indices: List[Optional[torch.Tensor]],
        grads: List[torch.Tensor],
        hyper: List[dict],
    ) -> None:
        """Updates each param's selected part in place: params[i][:, indices[i]] (the whole
        param where indices[i] is None) with grads[i]; hyper[i]: its param group's values."""
        for i, (param, idx, grad, h) in enumerate(zip(params, indices, grads, hyper)):
            if idx is not None and idx.numel() == 0:
                continue
            cols = None if idx is None else idx.to(param.device)
            part = param.data if cols is None else param.data[:, cols]
            m = self.state.get(i)
            if m is None:
                where = torch.device("cpu") if self.offload else part.device
                m = self.state[i] = _Moments(part, where)
            exp_avg, exp_avg_sq = m.exp_avg, m.exp_avg_sq
            if self.offload:
                exp_avg, exp_avg_sq = exp_avg.to(part.device), exp_avg_sq.to(part.device)
            update = _adamw if self.adamw_mode else _adam
            beta1, beta2 = h["betas"]
            update(
                [part],
                [grad.to(part.device, part.dtype)],
                [exp_avg],
                [exp_avg_sq],
                [],
                [m.step],
                foreach=False,
                amsgrad=False,
                beta1=float(beta1),
                beta2=float(beta2),
                lr=float(h["lr"]),
                weight_decay=float(h["weight_decay"]),
                eps=float(h["eps"]),
                maximize=False,
            )
            if cols is not None:
                param.data[:, cols] = part
            if self.offload:
                m.exp_avg.copy_(exp_avg)
                m.exp_avg_sq.copy_(exp_avg_sq)
