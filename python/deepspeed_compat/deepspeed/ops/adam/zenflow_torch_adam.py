"""`deepspeed.ops.adam.ZenFlowSelectiveAdamW` and `ZenFlowSelectiveAdamW_stage3`: DeepSpeed's
stand-alone optimizers of ZenFlow's selected columns, with DeepSpeed's calling convention.

The caller hangs the selection on each parameter, as DeepSpeed's ZeRO optimizers do:
`selected_indices` (the columns), `selected_grad` (their gradient), optionally
`temp_selected_param` (values to restore the columns to before the update) and, with
`offload=True`, the moments in `exp_avg_cpu_data` / `exp_avg_sq_cpu_data`. The update is
torch's AdamW on the selected part, its state of the selected shape. The stage-3 class works
on the parameter's partition `ds_tensor` laid out transposed (`ds_shape` = (columns, rows),
`complete_column_offset`/`complete_numel` the selected block), so a column is a row there; a
partition swapped to NVMe (`nvme_swapper`, `ds_tensor` a 0-dim placeholder) is swapped in
around the update. zerostream's own ZenFlow (zerostream/zero/zenflow/) keeps its selection
in its own objects and does not use these classes.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional

import torch
from torch.optim.adamw import adamw as _adamw


def _update(group: dict, parts: List[torch.Tensor], grads, exp_avgs, exp_avg_sqs, steps) -> None:
    if not parts:
        return
    beta1, beta2 = group["betas"]
    _adamw(
        parts,
        [g.to(p.device, p.dtype) for g, p in zip(grads, parts)],
        exp_avgs,
        exp_avg_sqs,
        [],
        steps,
        foreach=False,
        amsgrad=False,
        beta1=beta1,
        beta2=beta2,
        lr=group["lr"],
        weight_decay=group["weight_decay"],
        eps=group["eps"],
        maximize=False,
    )


class _SelectiveBase(torch.optim.AdamW):
    """The update shared by both layouts; subclasses say where a parameter's selected part
    is (`_read`, `_write`) and how to reach a swapped-out partition (`_swap_in`)."""

    def __init__(self, *args, offload: bool = False, bucket_size: float = 5e8, **kwargs):
        super().__init__(*args, **kwargs)
        if any(g.get("amsgrad") for g in self.param_groups):
            raise NotImplementedError(f"{type(self).__name__}: amsgrad is not supported")
        self.offload = offload
        self.bucket_size = bucket_size
        self.step = self._step_with_offload if offload else self._step_without_offload

    # --- layout hooks ----------------------------------------------------------------------------
    def _read(self, param) -> torch.Tensor:
        raise NotImplementedError

    def _write(self, param, values: torch.Tensor) -> None:
        raise NotImplementedError

    def _swap_in(self, param) -> bool:
        return False

    def _swap_out(self, param, write: bool) -> None:
        pass

    # --- DeepSpeed's methods ---------------------------------------------------------------------
    @torch.no_grad()
    def temp_copy_param(self, params_by_group) -> None:
        for param in self._params_of(params_by_group):
            if not hasattr(param, "selected_grad"):
                continue
            swapped = self._swap_in(param)
            copy = self._read(param).clone().detach()
            param.temp_selected_param = copy.cpu() if self.offload else copy
            if swapped:
                self._swap_out(param, write=False)

    def clear_selected_mv(self) -> None:
        for group in self.param_groups:
            for param in group["params"]:
                state = self.state.get(param)
                if not state:
                    continue
                if self.offload:
                    param.exp_avg_cpu_data.zero_()
                    param.exp_avg_sq_cpu_data.zero_()
                else:
                    state["exp_avg"].zero_()
                    state["exp_avg_sq"].zero_()

    def copy_mv_from_cpu(self, params: Iterable) -> None:
        for param in params:
            param.exp_avg = param.exp_avg_cpu_data.to(self._device_of(param), non_blocking=True)
            param.exp_avg_sq = param.exp_avg_sq_cpu_data.to(
                self._device_of(param), non_blocking=True
            )

    def copy_mv_to_cpu(self, params: Iterable) -> None:
        for param in params:
            param.exp_avg_cpu_data.copy_(param.exp_avg.data, non_blocking=True)
            param.exp_avg_sq_cpu_data.copy_(param.exp_avg_sq.data, non_blocking=True)
            param.exp_avg = None
            param.exp_avg_sq = None

    def _device_of(self, param) -> torch.device:
        return param.device

    def _params_of(self, params_by_group) -> List:
        if isinstance(params_by_group, dict):
            return [p for ps in params_by_group.values() for p in ps]
        return list(params_by_group)

    def _state_of(self, param, part: torch.Tensor, moments_in_state: bool) -> dict:
        state = self.state[param]
        if len(state) == 0:
            state["step"] = torch.zeros((), dtype=torch.float32)
            if moments_in_state:
                state["exp_avg"] = torch.zeros_like(part)
                state["exp_avg_sq"] = torch.zeros_like(part)
        return state

    @torch.no_grad()
    def _update_params(self, group: dict, params: List, restore: bool, offload: bool) -> None:
        """One AdamW step of the selected part of each param of `params` that has a selected
        gradient, its columns first restored from temp_selected_param when `restore`."""
        todo = [p for p in params if getattr(p, "selected_grad", None) is not None]
        swapped = [self._swap_in(p) for p in todo]
        parts, grads, avgs, sqs, steps = [], [], [], [], []
        for param in todo:
            part = self._read(param)
            temp = getattr(param, "temp_selected_param", None)
            if restore and temp is not None:
                part.copy_(temp.to(part.device))
            state = self._state_of(param, part, not offload)
            if offload:
                avgs.append(param.exp_avg.view_as(part))
                sqs.append(param.exp_avg_sq.view_as(part))
            else:
                avgs.append(state["exp_avg"])
                sqs.append(state["exp_avg_sq"])
            parts.append(part)
            grads.append(param.selected_grad)
            steps.append(state["step"])
        _update(group, parts, grads, avgs, sqs, steps)
        for param, part, was_swapped in zip(todo, parts, swapped):
            self._write(param, part)
            if was_swapped:
                self._swap_out(param, write=True)

    @torch.no_grad()
    def _step_without_offload(self) -> None:
        for group in self.param_groups:
            self._update_params(group, group["params"], restore=True, offload=False)
            for param in group["params"]:
                if hasattr(param, "temp_selected_param"):
                    param.temp_selected_param = None
                    param.selected_grad = None

    @torch.no_grad()
    def _step_with_offload(self) -> None:
        """Bucket by bucket of at most bucket_size elements, each bucket's moments brought
        from the host, used and sent back (group_step)."""
        for gi, group in enumerate(self.param_groups):
            bucket: List = []
            numel = 0
            for param in group["params"]:
                if not hasattr(param, "selected_grad"):
                    continue
                bucket.append(param)
                numel += param.numel()
                if numel >= self.bucket_size:
                    self._flush(gi, bucket)
                    bucket, numel = [], 0
            self._flush(gi, bucket)

    def _flush(self, gi: int, bucket: List) -> None:
        if not bucket:
            return
        for param in bucket:
            temp = getattr(param, "temp_selected_param", None)
            if temp is not None:
                swapped = self._swap_in(param)
                part = self._read(param)
                part.copy_(temp.to(part.device))
                self._write(param, part)
                if swapped:
                    self._swap_out(param, write=True)
                param.temp_selected_param = None
        self._group_step(gi, bucket)

    def _group_step(self, gi: int, params: List) -> None:
        group = self.param_groups[gi]
        if self.offload:
            self.copy_mv_from_cpu(params)
        self._update_params(group, params, restore=False, offload=self.offload)
        if self.offload:
            self.copy_mv_to_cpu(params)
        for param in params:
            param.selected_grad = None


class ZenFlowSelectiveAdamW(_SelectiveBase):
    """Columns `param.data[:, selected_indices]` of 2-D params, 1-D params whole."""

    def _read(self, param) -> torch.Tensor:
        return param.data[:, param.selected_indices] if param.dim() != 1 else param.data

    def _write(self, param, values: torch.Tensor) -> None:
        if param.dim() != 1:
            param.data[:, param.selected_indices] = values

    @torch.no_grad()
    def group_step(self, group_to_paramlist: Dict[int, List]) -> None:
        for gi, params in group_to_paramlist.items():
            self._group_step(gi, params)


class ZenFlowSelectiveAdamW_stage3(_SelectiveBase):  # noqa: N801 - DeepSpeed's name
    """Rows `selected_indices` of the transposed partition block (2-D), the partition whole
    (1-D); see the module's docstring."""

    def _rows(self, param) -> Optional[int]:
        return param.ds_shape[1] if len(param.ds_shape) != 1 else None

    def _block(self, param) -> torch.Tensor:
        rows = self._rows(param)
        flat = param.ds_tensor.data.narrow(0, param.complete_column_offset, param.complete_numel)
        return flat.view(param.complete_numel // rows, rows)

    def _read(self, param) -> torch.Tensor:
        if self._rows(param) is None:
            return param.ds_tensor.data
        idx = param.selected_indices.to(param.ds_tensor.data.device)
        return self._block(param)[idx, :]

    def _write(self, param, values: torch.Tensor) -> None:
        if self._rows(param) is not None:
            idx = param.selected_indices.to(param.ds_tensor.data.device)
            self._block(param)[idx, :] = values

    def _device_of(self, param) -> torch.device:
        return param.ds_tensor.device

    def _swap_in(self, param) -> bool:
        swapper = getattr(param, "nvme_swapper", None)
        if swapper is None or param.ds_tensor.data.dim() != 0:
            return False
        swapper.swap_in([param], async_op=False)
        return True

    def _swap_out(self, param, write: bool) -> None:
        if write:
            param.nvme_swapper.swap_out_and_release([param], async_op=False)
        else:  # read only: the stored partition is unchanged
            param.nvme_swapper.remove_partition_and_release_buffers([param])

    @torch.no_grad()
    def group_step(self, paramlist: List) -> None:
        """`paramlist`: params of any groups (each names its own in `group_id`)."""
        by_group: Dict[int, List] = {}
        for param in paramlist:
            by_group.setdefault(getattr(param, "group_id", 0), []).append(param)
        for gi, params in by_group.items():
            self._group_step(gi, params)


__all__ = ["ZenFlowSelectiveAdamW", "ZenFlowSelectiveAdamW_stage3"]
