"""ZenFlow at ZeRO stages 1 and 2 with offload_optimizer cpu: the important columns of each
2-D parameter (and 1-D parameters whole) are updated on the device every step from that
step's gradient; the rest is accumulated in host memory and applied by the CPU optimizer
every update_interval steps, synchronously or overlapped with the next steps
(overlap_step). DeepSpeed's design (deepspeed/runtime/zenflow/, docs/_tutorials/zenflow.md);
the pieces: schedule.py (which step does what), columns.py (selection and the selected
gradients), selective_adam.py (the device update), host_update.py (accumulation and the host
update).

Note [ZenFlow's step]: DeepSpeed runs ZenFlow with gradient_accumulation_steps replaced by
update_interval, so each backward's gradient is divided by update_interval and each step
is one micro-batch; zerostream takes gradient_accumulation_steps 1 and divides here, so
both sides see what DeepSpeed's see. Step t:
1. its gradient partitions are reduced (the stage's reducer, unchanged);
2. a selection step (schedule.py) first settles an overlapped update in flight, copies the
   device weights into the fp32 masters (they hold the selected columns' latest values;
   DeepSpeed's sync_fp32_param_from_gpu), zeroes the device moments and selects columns
   from this step's averaged gradient;
3. the gradient adds into the host accumulator;
4. after warm-up, the selected gradients are gathered and, except on an update step, the
   selected columns take an Adam step with the lr of the previous step's end (DeepSpeed
   updates them during the backward, before the engine's step reads the new lr);
5. on an update step the lr is read, the host update runs (host_update.py) and writes the
   masters into every unselected column, then the selected columns take their Adam step.
The lr schedule advances every step, as with DeepSpeed.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple, cast

import torch

from ...ops.adam import DeepSpeedCPUAdam
from ..stage12 import PartitionedOptimizer
from .affinity import optimizer_threads
from .columns import ColumnSelector
from .host_update import HostUpdate
from .schedule import resolve_schedule
from .selective_adam import SelectiveAdam

_PATH = "zero_optimization.zenflow"


class ZenFlowOptimizer(PartitionedOptimizer):
    def __init__(self, ctx, param_groups: List[dict], make_optimizer, make_swapped=None):
        if make_swapped is not None:
            raise NotImplementedError(
                f"{_PATH}: with the optimizer state swapped to NVMe or split by "
                "offload_optimizer.ratio; ZenFlow runs with offload_optimizer device cpu"
            )
        super().__init__(ctx, param_groups, make_optimizer)
        zf = ctx.config.zero_optimization.zenflow
        inner = self.optimizer
        if not isinstance(inner, DeepSpeedCPUAdam):
            raise NotImplementedError(
                f"{_PATH}: the optimizer is {type(inner).__name__}; ZenFlow's host update is "
                'DeepSpeed\'s CPU Adam (optimizer type "Adam" or "AdamW")'
            )
        for gi, group in enumerate(inner.param_groups):
            if not group.get("bias_correction", True):
                raise NotImplementedError(
                    f"{_PATH}: param group {gi} has bias_correction false; the device-side "
                    "update of the selected columns always corrects the bias"
                )
        if zf.offload and not ctx.config.zero_optimization.overlap_comm:
            raise ValueError(
                f"{_PATH}.offload: true needs zero_optimization.overlap_comm true (DeepSpeed "
                "asserts it: offload selective optimizer should be used with overlap_comm)"
            )
        self.schedule = resolve_schedule(zf)
        self.columns = ColumnSelector(self.flat_groups, zf.topk_ratio, ctx)
        self.device_adam = SelectiveAdam(inner.adamw_mode, zf.offload)
        threads = optimizer_threads(zf.pt_reserved_cores_perc) if zf.overlap_step else None
        self.host = HostUpdate(self, zf.overlap_step, threads)
        self.overlap_step = zf.overlap_step
        self.micro_step = -1
        # The hyperparameters the device update uses between update steps: the previous
        # step's (Note [ZenFlow's step], 4).
        self._device_hyper = self._read_hyper()

    def _read_hyper(self) -> List[dict]:
        return [
            {k: g[k] for k in ("lr", "betas", "eps", "weight_decay")}
            for g in self.optimizer.param_groups
        ]

    # --- the step --------------------------------------------------------------------------------
    def step(self) -> bool:
        t = self.micro_step = self.micro_step + 1
        with self.telemetry.phase("reduce"):
            # Stage1Reducer or Stage2Reducer (stage12.py), both with at_boundary.
            cast(Any, self.reducer).at_boundary()
        if self.copy_stage is not None:
            self.copy_stage.drain()  # the gradient downloads have landed
        sched = self.schedule
        divisor = self.dp_divisor * sched.update_interval
        if sched.selects(t):
            self.host.settle()
            if t != 0:
                self._masters_from_device()
            self.device_adam.clear()
            self.columns.select(self.grads)
        self.host.accumulate(self.grads)
        selected = None
        if sched.selective(t):
            selected = self.columns.gather(self.grads, 1.0 / divisor)
        updates = sched.updates(t)
        if selected is not None and not updates:
            self._device_step(selected)
        self._device_hyper = self._read_hyper()
        applied = True
        if updates:
            asynchronous = self.overlap_step and t >= sched.warm_up
            applied = self.host.update(t, divisor, asynchronous)
            if selected is not None:
                self._device_step(selected)
        self.zero_grad()
        return applied

    def _params(self) -> List[torch.Tensor]:
        return [p.slot.param for p in self.columns.pieces]

    def _device_step(self, selected: List[torch.Tensor]) -> None:
        hyper = [self._device_hyper[p.group] for p in self.columns.pieces]
        assert self.columns.indices is not None  # selective steps follow a selection
        self.device_adam.step(self._params(), self.columns.indices, selected, hyper)

    def _selected_values(self) -> List[Tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]]:
        """(param, columns or None for all, their current values) of everything selected."""
        if self.columns.indices is None or not self.schedule.selective(self.micro_step):
            return []
        out: List[Tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]] = []
        for param, idx in zip(self._params(), self.columns.indices):
            if idx is None:
                out.append((param, None, param.data.clone()))
            elif idx.numel():
                cols = idx.to(param.device)
                out.append((param, cols, param.data[:, cols].clone()))
        return out

    @torch.no_grad()
    def apply_masters(self) -> None:
        """The masters become every rank's 16-bit weights, except the selected columns,
        which keep the device's values (DeepSpeed's temp_copy_param and its restore)."""
        kept = self._selected_values()
        for flat, master in zip(self.flat_groups, self.masters):
            flat.partition().copy_(master)
        self._publish()
        for param, cols, values in kept:
            if cols is None:
                param.data.copy_(values)
            else:
                param.data[:, cols] = values

    @torch.no_grad()
    def _masters_from_device(self) -> None:
        for flat, master in zip(self.flat_groups, self.masters):
            master.copy_(flat.partition())

    # --- what the rest of the engine reads -------------------------------------------------------
    def close_state(self) -> None:
        self.host.settle()
        super().close_state()

    def state_dict(self, streamed: bool = False) -> dict:
        raise NotImplementedError(
            f"{_PATH}: saving a checkpoint of a ZenFlow run (its selection, device moments "
            "and host accumulator) is not implemented by zerostream"
        )

    def load_state_dict(self, state: dict, publish: bool = True) -> None:
        raise NotImplementedError(
            f"{_PATH}: loading a checkpoint into a ZenFlow run is not implemented by zerostream"
        )
