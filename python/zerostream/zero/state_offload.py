"""`engine.offload_states()` / `engine.reload_states()`: DeepSpeed's API for parking a ZeRO
engine's device-resident state in host memory between training phases (RLHF frameworks do it
while an inference engine uses the GPU), and bringing it back.

Note [Parking state in host memory]
  What can be parked (DeepSpeed's OffloadStateTypeEnum), per stage 1-3:
  - optim_states: the inner optimizer's state tensors (Adam's moments);
  - hp_params: the fp32 (or bf16) master partitions;
  - lp_grads: the gradient partitions the reducer lands into;
  - lp_params: the 16-bit weights: stages 1/2 the flat group buffers (every parameter is a
    view of one), stage 3 this rank's flat shard partitions (every `ds_tensor` is a view of
    one) and the gathered copies of persistent parameters;
  - contiguous_grad_buffer: stage 1's buffer of gradients accumulated and not yet reduced.
  State already in host memory stays where it is (an offloaded optimizer's masters, moments
  and gradient partitions; everything on a CPU run), so on a machine without a GPU both calls
  move nothing. A parked tensor keeps its identity (`t.data` is swapped), so the optimizer's
  state dict, its param groups and the reducer's targets still hold it; the views carved out
  of a moved buffer (parameters, shards) are carved again from the new storage, both ways.
  Between the two calls the engine refuses forward, backward, step and save_checkpoint by
  name; reload_states puts everything back where it was and training goes on bitwise.
  With offload_param (DeepSpeed refuses it: its issue #6596) the shards stay where
  offload_param keeps them, host memory or NVMe, and the rest is parked as above: the
  persistent params' full copies and whatever else is on the device (an optimizer that is
  not offloaded). Refused as in DeepSpeed: stage 0, NVMe as the target ("cpu" only),
  offloading twice without a reload.
  The copies go over the copy stage's lanes (offload/copy_stage.py lanes_for: a stream per
  direction, each waiting for the compute stream first; on the simulated device in the
  device tests), and both calls return only once the last copy is complete: the caller may
  read the parked tensors (a save, get_state_devices) or give the device memory to another
  process right after offload_states, and the page-locked sources of reload_states go with
  the parked list. `non_blocking` is accepted for DeepSpeed's signature; the copies are
  asynchronous either way and waited for once at the end.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional

import torch

from ..accelerator import get_accelerator
from ..offload.copy_stage import lanes_for

OFFLOADED = "the engine's states are offloaded (offload_states); call engine.reload_states() first"

# Tests set it so that tensors already in host memory are copied too: on a CPU run that is the
# only way to exercise the re-pointing of views (Note [Parking state in host memory]).
_COPY_HOST_TENSORS = False


class OffloadStateType(str, enum.Enum):
    """DeepSpeed's OffloadStateTypeEnum (same values)."""

    optim_states = "optim_states"
    hp_params = "hp_params"
    lp_params = "lp_params"
    lp_grads = "lp_grads"
    contiguous_grad_buffer = "contiguous_grad_buffer"


@dataclass
class StateGroup:
    """Tensors of one kind, and what re-carves the views of the moved ones."""

    tensors: List[torch.Tensor]
    repoint: Optional[Callable[[], None]] = None


@dataclass
class Parked:
    """Where each parked tensor lived, to put it back."""

    homes: List[tuple] = field(default_factory=list)  # (tensor, device)
    repoints: List[Callable[[], None]] = field(default_factory=list)


def kinds_of(include) -> List[OffloadStateType]:
    """`include` (None: all) as a list of kinds; unknown names are refused by name."""
    if include is None:
        return list(OffloadStateType)
    out = []
    for item in include:
        value = getattr(item, "value", item)
        try:
            out.append(OffloadStateType(value))
        except ValueError:
            names = ", ".join(k.value for k in OffloadStateType)
            raise ValueError(f"offload_states: unknown state {item!r}; one of {names}") from None
    return out


def _movable(t: torch.Tensor) -> bool:
    return t.numel() > 0 and (t.device.type != "cpu" or _COPY_HOST_TENSORS)


def park(
    groups: Dict[OffloadStateType, StateGroup],
    kinds: Iterable[OffloadStateType],
    pin_memory: bool,
    lanes,
) -> Parked:
    """Moves the device-resident tensors of `kinds` to host memory over `lanes`' download
    lane; returns once every copy is complete (Note [Parking state in host memory])."""
    parked = Parked()
    seen = set()
    last = None
    with torch.no_grad():
        for kind in kinds:
            group = groups.get(kind)
            if group is None:
                continue
            moved = False
            for t in group.tensors:
                if id(t) in seen or not _movable(t):
                    continue
                seen.add(id(t))
                pin = pin_memory and t.device.type == "cuda"  # page-locked helps a device copy
                host = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin)
                # The lane keeps the device source alive until it has read it (record_stream).
                last = lanes.copy(host, t.detach(), upload=False) or last
                parked.homes.append((t, t.device))
                t.data = host
                moved = True
            if moved and group.repoint is not None:
                group.repoint()
                parked.repoints.append(group.repoint)
    if last is not None:
        lanes.host_wait(last)  # a lane completes its copies in order
    return parked


def unpark(parked: Parked, lanes) -> None:
    """Puts every parked tensor back on the device it came from over `lanes`' upload lane,
    re-carves the views, and returns once the copies are complete."""
    last = None
    with torch.no_grad():
        for t, device in parked.homes:
            back = torch.empty(t.shape, dtype=t.dtype, device=device)
            last = lanes.copy(back, t.detach(), upload=True) or last
            t.data = back
        for repoint in parked.repoints:
            repoint()
    if last is not None:
        lanes.device_wait(last)  # the compute stream reads them next
        lanes.host_wait(last)  # the host sources are released with `parked`


# --- the engine's two calls --------------------------------------------------------------------
def offload_engine_states(engine, include=None, device="cpu", pin_memory=True, non_blocking=False):
    """engine.offload_states: parks `include` (None: every kind) in host memory."""
    import logging

    from .protocol import TrainingState

    target = getattr(device, "value", device)
    if target in (None, "none"):
        logging.getLogger("zerostream").warning("offload_states: no device given; nothing moved")
        return
    if target == "nvme":
        raise ValueError('offload_states: NVMe is not a target for offloaded states; use "cpu"')
    if target != "cpu":
        raise ValueError(f'offload_states: device {device!r}; the only target is "cpu"')
    if engine.optimizer is None:
        raise RuntimeError("offload_states: the engine has no optimizer whose states to move")
    if not hasattr(engine.optimizer, "offloadable_states"):  # stage 0's replicated optimizer
        raise RuntimeError(
            "offload_states: needs ZeRO stage 1, 2 or 3 (zero_optimization.stage is "
            f"{engine.zero_optimization_stage()})"
        )
    if engine._parked is not None:
        raise RuntimeError("offload_states: the states are offloaded already; reload_states first")
    engine._run.require(TrainingState.IDLE, what="offload_states")
    engine._run.require_consistent("offload_states")
    groups = engine.optimizer.offloadable_states()
    engine._parked = park(groups, kinds_of(include), pin_memory, lanes_for(engine.device))
    # The device blocks the parked tensors held go back to the device, not only to torch's
    # caching allocator: the process that offloads (an RLHF trainer) lends the memory to
    # another one (its inference engine), as DeepSpeed's offload_states does at every stage.
    get_accelerator().empty_cache()
    engine._run.set_inconsistent(OFFLOADED)


def reload_engine_states(engine, non_blocking=False) -> None:
    """engine.reload_states: everything offload_states moved goes back; nothing to do when
    nothing is offloaded."""
    if engine._parked is None:
        return
    unpark(engine._parked, lanes_for(engine.device))
    engine._parked = None
    if engine._run.inconsistent == OFFLOADED:
        engine._run.set_inconsistent(None)


def state_devices(engine, kind) -> set:
    """The devices the tensors of state `kind` are on now (DeepSpeed's get_state_devices)."""
    (kind,) = kinds_of([kind])
    group = engine.optimizer.offloadable_states().get(kind)
    return {t.device for t in group.tensors} if group is not None else set()
