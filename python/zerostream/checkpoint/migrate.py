"""DeepSpeed's optimizer state in the form zerostream's optimizers load (issue 13, "Migration
from DeepSpeed").

What DeepSpeed 0.19.8 writes, found by running it (tests/python/checkpoint/ds_run.py) and
where it differs from zerostream's own files (reference §3.2-3.3 for the common part):

- Stage 0, fp32: the model-states file's `optimizer` is the bare torch optimizer state_dict
  (zerostream wraps it: `zero_stage`, loss scaler, `base_optimizer_state`).
- Stage 0, bf16/fp16: `optimizer` is DeepSpeed's FP16 wrapper state: `cur_scale`, `cur_iter`,
  `dynamic_loss_scale` (+ `last_overflow_iter`, `scale_factor`, `scale_window` when
  dynamic), `optimizer_state_dict`, and the fp32 masters as `fp32_groups` (per group, per
  param) or `fp32_groups_flat` (per group, flat). Its unfused wrapper steps the inner
  optimizer once at construction, so `step` is one ahead of the steps taken; loaded as is,
  the run continues exactly as DeepSpeed would.
- Stages 1-3: the layout is zerostream's, but `loss_scaler` and `zero_stage` are pickled
  DeepSpeed objects (read as plain data by compat_unpickle.py); stages 1/2 add
  `param_slice_mappings` and `param_alignment_paddings` (per-param padding inside the flat
  group when zero_optimization.parameter_alignment is on); with round_robin_gradients the
  flatten order (`param_shapes`) is not the module's; at stage 3 every sub-group
  (sub_group_size) is its own flat partition. Any of these, or another world size, sends
  the load through reshard.py, which re-cuts by parameter name. With elastic_checkpoint the
  inner state is a list of per-group states without padding and without hyperparameters.
- BF16_Optimizer (stage 1 + bf16 with fp32 gradient accumulation): no `zero_stage` and no
  loss scaler; otherwise the stage-1 layout.
- The inner param groups are those of DeepSpeed's inner optimizer (torch's AdamW keys such
  as `foreach`, or DeepSpeedCPUAdam's); the saved hyperparameters are kept for the keys
  this run's optimizer has, the others come from this run.

Each function is a no-op on what zerostream itself wrote. What they need of this run's
optimizer comes from its stage's PartitionLayout (Note [Stage checkpoints] in
zero/protocol.py): its inner param groups, its loss scaler's state, its groups and cuts.
"""

from __future__ import annotations

import logging
from typing import Any, List, Optional

import torch

from ..lazy_tensor import LazyTensor, materialize
from . import layout

logger = logging.getLogger("zerostream")

_SCALER_KEYS = ("cur_scale", "cur_iter", "last_overflow_iter", "scale_factor", "scale_window")


def scaler_state(saved: Optional[dict], current: dict, where: str) -> dict:
    """The saved loss-scaler state in the form this run's scaler loads (`current`: its state
    now). Keys DeepSpeed does not save (the hysteresis of its FP16 wrappers) come from this
    run's scaler; a scaler of the other kind (static vs dynamic: the precision changed) is
    not loaded."""
    if not isinstance(saved, dict):
        return current
    if bool(saved.get("dynamic", False)) != bool(current["dynamic"]):
        logger.warning(
            "load_checkpoint: %s holds a %s loss scaler and this run has a %s one "
            "(fp16 changed); the loss scale starts from this run's config",
            where,
            "dynamic" if saved.get("dynamic") else "static",
            "dynamic" if current["dynamic"] else "static",
        )
        return current
    return {**current, **saved}


def param_groups(saved: List[dict], current: List[dict], where: str) -> List[dict]:
    """Saved inner param groups with the keys this run's optimizer knows: saved values for
    those (lr, betas, eps, weight_decay, ...), this run's for the others, saved `params`."""
    if len(saved) != len(current):
        raise ValueError(
            f"load_checkpoint: {where} holds {len(saved)} optimizer param groups; this run "
            f"has {len(current)}"
        )
    out = []
    for old, new in zip(saved, current):
        group = {k: v for k, v in new.items() if k != "params"}
        group.update({k: v for k, v in old.items() if k in group})
        group["params"] = old["params"]
        out.append(group)
    return out


def inner_state(inner: dict, current: List[dict], where: str) -> dict:
    return {**inner, "param_groups": param_groups(inner["param_groups"], current, where)}


# --- stages 1-3 -------------------------------------------------------------------------------
def zero_state(state: dict, part, where: str) -> dict:
    """One rank's `optimizer_state_dict` of a ZeRO checkpoint in zerostream's layout for this
    run (`part`: its stage's PartitionLayout; None where no run loads it, as in the
    conversion to a universal checkpoint: the saved loss scaler is kept as it is; `where`
    names the file in errors)."""
    out = dict(state)
    if "zero_stage" not in out:
        if "single_partition_of_fp32_groups" not in out:
            raise ValueError(
                f"load_checkpoint: {where} is not a ZeRO optimizer state (keys {sorted(out)})"
            )
        out["zero_stage"] = 1  # DeepSpeed's BF16_Optimizer: stage 1's layout
    out["zero_stage"] = int(out["zero_stage"])
    if part is not None:
        out["loss_scaler"] = scaler_state(out.get("loss_scaler"), part.loss_scaler, where)
    scaler = out.get("loss_scaler")
    dynamic = scaler.get("dynamic", False) if isinstance(scaler, dict) else False
    out.setdefault("dynamic_loss_scale", bool(dynamic))
    out.setdefault("overflow", False)
    for key in (inner_key(out["zero_stage"]), masters_key(out["zero_stage"])):
        if key not in out:
            raise ValueError(f"load_checkpoint: {where} has no {key!r}")
    key = inner_key(out["zero_stage"])
    if isinstance(out[key], list):
        if part is None:
            raise NotImplementedError(
                f"{where} is an elastic checkpoint (zero_optimization.elastic_checkpoint), "
                f"whose optimizer state has no hyperparameters; load it into a run (any "
                f"world size) and save it again to convert it"
            )
        inner = materialize(out[key])
        step = out.get("base_optimizer_state_step")
        out[key] = _elastic_inner(inner, step, part.param_groups, where)
        out[NO_HYPERPARAMETERS] = True
    return out


def _elastic_inner(groups: List[dict], step, current: List[dict], where: str) -> dict:
    """zero_optimization.elastic_checkpoint: DeepSpeed saves, per group, the inner state
    without the end padding (the step apart when the optimizer keeps it in its param
    groups) and no hyperparameters, which then come from this run's (`current`)."""
    if len(groups) != len(current):
        raise ValueError(
            f"load_checkpoint: {where} holds {len(groups)} optimizer param groups; this run "
            f"has {len(current)}"
        )
    logger.warning(
        "load_checkpoint: %s is an elastic checkpoint, which saves no optimizer "
        "hyperparameters; lr comes from the restored LR scheduler, betas and weight decay "
        "from this run's config",
        where,
    )
    state = {}
    for g, st in enumerate(groups):
        st = dict(st)
        if step is not None:
            st.setdefault("step", step)
        state[g] = st
    param_groups = [
        {**{k: v for k, v in pg.items() if k != "params"}, "params": [g]}
        for g, pg in enumerate(current)
    ]
    return {"state": state, "param_groups": param_groups}


# Set on a state whose inner param groups were not saved (elastic): the loader then writes
# the lr the restored scheduler gives for the saved iteration.
NO_HYPERPARAMETERS = "zerostream_no_hyperparameters"


def lr_from_scheduler(scheduler) -> None:
    """Writes the scheduler's lr for its restored iteration into the optimizer's groups
    (DeepSpeed-style schedulers: step(last_batch_iteration) re-applies it)."""
    iteration = getattr(scheduler, "last_batch_iteration", None)
    if iteration is not None and iteration >= 0:
        scheduler.step(iteration)


def with_param_groups(state: dict, part, where: str) -> dict:
    """zero_state()'s result ready for this run's optimizer (same layout): the inner param
    groups carry this run's keys."""
    key = inner_key(state["zero_stage"])
    return {**state, key: inner_state(state[key], part.param_groups, where)}


def inner_key(zero_stage: int) -> str:
    """The key of the inner optimizer's state in a state saved at `zero_stage`."""
    return "optimizer_state_dict" if layout.sharded(zero_stage) else "base_optimizer_state"


def masters_key(zero_stage: int) -> str:
    """The key of the fp32 master partitions in a state saved at `zero_stage`."""
    return "fp32_flat_groups" if layout.sharded(zero_stage) else "single_partition_of_fp32_groups"


def alignment_paddings(state: dict) -> Optional[List[List[int]]]:
    """DeepSpeed's per-parameter padding inside each flat group, None when there is none."""
    pads = state.get("param_alignment_paddings")
    if pads and any(any(int(x) for x in group) for group in pads):
        return [[int(x) for x in group] for group in pads]
    return None


# --- stage 0 ---------------------------------------------------------------------------------
def stage0_state(saved: Any, part, where: str) -> dict:
    """The model-states file's `optimizer` (stage 0) in the form ReplicatedOptimizer loads
    (`part`: its PartitionLayout, not partitioned)."""
    if not isinstance(saved, dict):
        raise ValueError(f"load_checkpoint: {where}: 'optimizer' is not a state dict")
    current = part.param_groups
    if "zero_stage" in saved:  # zerostream's own
        out = dict(saved)
        out["base_optimizer_state"] = inner_state(saved["base_optimizer_state"], current, where)
        return out
    if "state" in saved and "param_groups" in saved:  # DeepSpeed fp32: the torch optimizer's
        base, masters, scaler = saved, None, None
    elif "optimizer_state_dict" in saved:  # DeepSpeed's FP16 wrappers (bf16/fp16)
        base = saved["optimizer_state_dict"]
        masters = _stage0_masters(saved, part, where)
        scaler = {"dynamic": bool(saved.get("dynamic_loss_scale", False))}
        scaler.update({k: saved[k] for k in _SCALER_KEYS if k in saved})
    else:
        raise ValueError(
            f"load_checkpoint: {where}: 'optimizer' has keys {sorted(saved)}, which is "
            f"neither zerostream's nor a DeepSpeed 0.19 stage-0 optimizer state"
        )
    out = {
        "zero_stage": 0,
        "loss_scaler": scaler_state(scaler, part.loss_scaler, where),
        "overflow": False,
        "base_optimizer_state": inner_state(base, current, where),
    }
    if part.fp32_masters:
        params = [p for group in part.groups for p in group]
        out["fp32_masters"] = (
            masters if masters is not None else [p.detach().float() for p in params]
        )
    return out


def _stage0_masters(saved: dict, part, where: str) -> List[torch.Tensor]:
    """DeepSpeed's fp32 masters, one tensor per parameter in optimizer order."""
    params = [p for group in part.groups for p in group]
    if "fp32_groups" in saved:
        masters = [t for group in saved["fp32_groups"] for t in group]
    elif "fp32_groups_flat" in saved:
        masters = []
        sizes = [[p.numel() for p in g["params"]] for g in part.param_groups]
        if len(sizes) != len(saved["fp32_groups_flat"]):
            raise ValueError(
                f"load_checkpoint: {where}: 'fp32_groups_flat' has "
                f"{len(saved['fp32_groups_flat'])} groups; this run has {len(sizes)}"
            )
        for flat, numels in zip(saved["fp32_groups_flat"], sizes):
            masters.extend(flat.reshape(-1).split(numels)[: len(numels)])
    else:
        raise ValueError(f"load_checkpoint: {where}: no fp32 master weights ('fp32_groups')")
    if len(masters) != len(params):
        raise ValueError(
            f"load_checkpoint: {where} holds fp32 masters of {len(masters)} parameters; "
            f"this run trains {len(params)}"
        )
    for i, (m, p) in enumerate(zip(masters, params)):
        if m.numel() != p.numel():
            raise ValueError(
                f"load_checkpoint: {where}: fp32 master {i} has {m.numel()} elements; the "
                f"parameter it belongs to has {p.numel()}"
            )
    return [m.float().reshape(p.shape) for m, p in zip(masters, params)]


def same_layout(sd: dict, state: dict, module: torch.nn.Module, part, same_world: bool) -> bool:
    """True when this rank's saved partitions are cut exactly as this run cuts them (`part`:
    its stage's PartitionLayout), so they load as they are; else reshard.optimizer_state
    re-cuts them by parameter name."""
    if not same_world or alignment_paddings(state) is not None:
        return False
    if layout.sharded(state["zero_stage"]) != layout.sharded(part.zero_stage):
        return False
    ours = [list(s.keys()) for s in layout.param_shapes(module, part.groups)]
    if [list(s.keys()) for s in sd.get("param_shapes") or []] != ours:
        return False
    masters = state.get(masters_key(part.zero_stage))
    numels = part.numels
    if masters is None or len(masters) != len(numels):
        return False
    if any(m.numel() > n for m, n in zip(masters, numels)):
        return False
    inner = state[inner_key(part.zero_stage)]
    for g, group in enumerate(inner["param_groups"]):
        if len(group["params"]) != 1:
            return False
        st = inner["state"].get(group["params"][0], {})
        tensors = [v for v in st.values() if torch.is_tensor(v) or isinstance(v, LazyTensor)]
        if any(v.dim() > 0 and v.numel() != numels[g] for v in tensors):
            return False
    return True
