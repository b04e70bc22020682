"""The options the planner compares and the one it recommends: every fixed ZeRO option
(plan.OPTIONS), the memory-tier placements of the NVMe ones (what of the optimizer state and
the param shards the GPU and host memory they leave can hold: Note [Optimizer tiers], Note
[Parameter shards in host memory] in offload/placement/, Note [The device tier]) and the
GPU tier of the "cpu" one, each predicted by plan.predict; `best` picks among them.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import List, Optional, Tuple

from .machine import Machine
from .model import ModelShape
from .plan import OPTIONS, Option, Prediction, Workload, predict


def predict_all(shape: ModelShape, work: Workload, machine: Machine) -> List[Prediction]:
    out = [predict(shape, work, machine, Option(*o)) for o in OPTIONS]
    for base in [o for o in out if o.option.stage == 3 and o.option.optimizer == "nvme"]:
        if base.option.param in ("none", "nvme"):
            tiered = plan_tiers(shape, work, machine, base)
            if tiered is not None:
                out.append(tiered)
    labels = {p.option.label for p in out}
    cpu = next(p for p in out if p.option == Option(3, "cpu", "none"))
    with_gpu = plan_gpu_tier(shape, work, machine, cpu)
    if with_gpu is not None and with_gpu.option.label not in labels:
        out.append(with_gpu)
    return out


def plan_gpu_tier(
    shape: ModelShape, work: Workload, machine: Machine, base: Prediction
) -> Optional[Prediction]:
    """An offload_optimizer "cpu" option (stage 3, params on the GPUs) with the GPU memory it
    leaves holding whole optimizer sub-groups of 1e8 elements (offload_optimizer.ratio):
    less state in host RAM and less work for the CPU kernel. None when nothing fits there."""
    part = math.ceil(shape.params / machine.world)
    option = Option(base.option.stage, "cpu", base.option.param, gpu_tier=True)
    plans = []
    for where in GRAD_HOMES:
        knobs = replace(base.knobs, sub_group_size=int(1e8), device_tier_grads=where)
        ratio, on_gpu = _gpu_tier(part, work, machine, replace(base, knobs=knobs))
        if on_gpu:
            plans.append(predict(shape, work, machine, option, replace(knobs, offload_ratio=ratio)))
    return _faster(plans)


# Where the device tier's gradients may land, DeepSpeed's first: the planner takes "host"
# only when its step is faster (Note [Device-tier gradients stay on the device]).
GRAD_HOMES = ("device", "host")


def _faster(plans: List[Prediction]) -> Optional[Prediction]:
    """The plan with the shorter step (the first of equals), None when there is none."""
    return min(plans, key=lambda p: p.step_seconds) if plans else None


def plan_tiers(
    shape: ModelShape, work: Workload, machine: Machine, base: Prediction
) -> Optional[Prediction]:
    """The memory-tier placement of an NVMe option (Note [Optimizer tiers] and Note
    [Parameter shards in host memory], offload/placement/; Note [The device tier]):
    - the GPU memory the all-on-NVMe option leaves (stage 3, params not offloaded) takes
      whole optimizer sub-groups first, as offload_optimizer.ratio: each element there
      saves 2 x state_bytes of disk traffic and the CPU kernel's work, and costs no host
      memory;
    - the host memory it leaves free on each node, shared by its processes, goes to param
      shards on disk (6 bytes of disk traffic saved per step for 2 held), then to the
      optimizer state still on disk (24 saved for 12, or 2 x state_bytes for state_bytes).
    None when nothing is free. Where the GPU tier's gradients land is planned both ways and
    the faster taken."""
    plans = []
    for where in GRAD_HOMES:
        homed = replace(base, knobs=replace(base.knobs, device_tier_grads=where))
        plans.append(_plan_tiers(shape, work, machine, homed))
    return _faster([p for p in plans if p is not None])


def _plan_tiers(
    shape: ModelShape, work: Workload, machine: Machine, base: Prediction
) -> Optional[Prediction]:
    part = math.ceil(shape.params / machine.world)
    d = work.dtype_bytes
    ratio, on_gpu = _gpu_tier(part, work, machine, base)
    free = (machine.host_usable - base.host_node) // machine.gpus_per_node
    if base.knobs.device_tier_grads == "device":  # the host gradient partition shrinks
        free += work.offloaded_grad_bytes * on_gpu
    if free <= 0 and not on_gpu:
        return None
    free = max(0, free)
    shards = base.nvme.get(f"{'fp32' if d == 4 else '16-bit'} param shards", 0)
    keep = min(shards, free)
    free -= keep
    knobs = replace(
        base.knobs,
        max_in_cpu=keep // d,
        optimizer_max_in_cpu=min(part - on_gpu, free // work.state_bytes),
        offload_ratio=ratio,
    )
    if on_gpu + knobs.optimizer_max_in_cpu == part and keep == shards:
        if not on_gpu:
            return None  # nothing left on disk: the "cpu" options say it
        # The GPUs and host RAM hold all of it: offload_optimizer "cpu" with the ratio.
        option = Option(base.option.stage, "cpu", base.option.param, gpu_tier=True)
        return predict(shape, work, machine, option, replace(base.knobs, offload_ratio=ratio))
    option = Option(
        base.option.stage,
        base.option.optimizer,
        base.option.param,
        tiered=free > 0 or keep > 0,
        gpu_tier=on_gpu > 0,
    )
    return predict(shape, work, machine, option, knobs)


def _gpu_tier(part: int, work: Workload, machine: Machine, base: Prediction) -> Tuple[float, int]:
    """(offload_optimizer.ratio, elements on the GPU): the whole sub-groups of this rank's
    partition that fit the GPU memory `base` leaves (with their gradients, or one sub-group's
    gradient buffer when they land on the host: base.knobs.device_tier_grads),
    as the ratio whose int((1 - ratio) * n) is their count (half a sub-group of margin
    against rounding). (1.0, 0) off stage 3, with offloaded params, or without a GPU."""
    option = base.option
    if machine.cpu_only or option.stage != 3 or option.param != "none":
        return 1.0, 0
    width = min(base.knobs.sub_group_size or part, part)
    n = math.ceil(part / width)
    spare = machine.gpu_mem - machine.gpu_reserve - base.device_peak
    grad = work.offloaded_grad_bytes
    if base.knobs.device_tier_grads == "device":  # gradients beside the state
        k = max(0, min(n, spare // ((work.state_bytes + grad) * width)))
    else:  # one sub-group's gradient buffer
        k = max(0, min(n, (spare - grad * width) // (work.state_bytes * width)))
    if k == 0:
        return 1.0, 0
    ratio = 1.0 - (k + 0.5) / n if k < n else 0.0
    return ratio, min(part, k * width)


def best(predictions: List[Prediction]) -> Optional[Prediction]:
    """The fastest option that fits; among equally fast ones (within 1%) the one that
    offloads least, then the lower stage."""
    fitting = [p for p in predictions if p.fits]
    if not fitting:
        return None
    fastest = min(p.step_seconds for p in fitting)
    close = [p for p in fitting if p.step_seconds <= fastest * 1.01]
    return min(close, key=lambda p: (p.option.offloads, p.option.stage, p.step_seconds))
