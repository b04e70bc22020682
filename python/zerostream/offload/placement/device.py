"""`zerostream.optimizer_max_on_device`: the optimizer sub-groups kept and stepped on the
compute device, as an element count (`build`, when the optimizer is built, like
offload_optimizer.ratio) or "auto" sized from a measured step (DevicePlacement, held by the
sub-grouped optimizer; Note [The device tier from a measured step] in the package
docstring)."""

from __future__ import annotations

import gc
import logging
from typing import Callable, List, Optional, Union

import torch

from ..device_tier import RATIO_KEY, DeviceTier, device_count
from ..memory_preflight import skewed
from .budgets import device_budget_bytes, device_update_bytes
from .plans import choose, count_within

logger = logging.getLogger("zerostream")

KEY = "zerostream.optimizer_max_on_device"


def build(
    sub_groups: list,
    kind_dtypes: List[torch.dtype],
    home: torch.device,
    ratio: float,
    max_on_device: Union[int, str],
) -> Optional[DeviceTier]:
    """The device tier placed when the optimizer is built: the first sub-groups in step order
    that offload_optimizer.ratio keeps (DeepSpeed's rule) or that fit an element count of
    zerostream.optimizer_max_on_device; None without one ("auto" places later)."""
    value: "int | float"
    if isinstance(max_on_device, int) and max_on_device > 0:
        n, key, value = (
            count_within([s.hi - s.lo for s in sub_groups], max_on_device),
            KEY,
            max_on_device,
        )
        if not n and sub_groups:  # asked for, not placed: said, never silent
            logger.warning(
                "%s %d: the first optimizer sub-group (%d elements) does not fit in it, so "
                "nothing is kept on the device; raise it or lower "
                "zero_optimization.sub_group_size",
                KEY,
                max_on_device,
                sub_groups[0].hi - sub_groups[0].lo,
            )
    else:
        n, key, value = device_count(len(sub_groups), ratio), RATIO_KEY, ratio
    if not n:
        return None
    tier = DeviceTier(sub_groups[:n], kind_dtypes, home, key=key)
    logger.info(
        "%s %s: %d of %d optimizer sub-groups (%d of %d elements, %.2f GiB of state) "
        "are stepped on %s",
        key,
        value,
        n,
        len(sub_groups),
        tier.elements,
        sum(s.hi - s.lo for s in sub_groups),
        tier.state_bytes / 2**30,
        home,
    )
    return tier


class DevicePlacement:
    """The "auto" device tier of a sub-grouped optimizer: when to measure, the budget, which
    sub-groups move. Its owner hands it the offloaded sub-groups and moves their state
    (`move(sub_group, from_disk)`, into the sub-group's just-allocated device tensors)."""

    def __init__(
        self, max_on_device: Union[int, str], home: torch.device, agree: Optional[Callable] = None
    ):
        self.pending = max_on_device == "auto"
        self.home = home
        self.agree = agree
        self.inputs: Optional[dict] = None  # what place() decided from
        # Set by stage 3: whether the step under way ran the recorded trace's plan (its
        # prefetches make the peak a step needs; the recording step, or one that left its
        # trace, gathers less at once). The same on every rank (the trace is agreed).
        self.step_planned: Optional[Callable[[], bool]] = None

    def at_step(
        self,
        steps_here: int,
        offloaded: List,
        kind_dtypes: List[torch.dtype],
        grad_itemsize: int,
        move: Callable,
    ) -> Optional[DeviceTier]:
        """At the start of each optimizer step while "auto" is pending: the first starts the
        measured interval (a whole iteration: this optimizer step, the next forward and
        backward), the second places the tier. The tier made, or None."""
        from ...accelerator import get_accelerator

        if not self.pending:
            return None
        if steps_here == 0 or (self.step_planned is not None and not self.step_planned()):
            # The interval starts (again): a step that did not run the stage-3 plan would
            # size the tier from too small a peak, and it ran out of memory later.
            get_accelerator().reset_memory_peak()
            return None
        return self.place(offloaded, kind_dtypes, grad_itemsize, move)

    def place(
        self, offloaded: List, kind_dtypes: List[torch.dtype], grad_itemsize: int, move: Callable
    ) -> Optional[DeviceTier]:
        """ "auto", at the start of an optimizer step after a measured one: the offloaded
        sub-groups that fit the device memory it leaves move there, for good."""
        from ...accelerator import get_accelerator

        self.pending = False
        gc.collect()  # tensors only a reference cycle holds are not the step's needs
        room = get_accelerator().memory_room()
        if room is None:
            self.inputs = {"source": "the device's memory is the host's"}
            logger.info(
                '%s "auto": the compute device (%s) has no memory of its own; every optimizer '
                "sub-group stays offloaded",
                KEY,
                self.home,
            )
            return None
        free, excess, total = room
        free, excess = skewed(free, "device_free"), skewed(excess, "device_excess")
        width = max((s.hi - s.lo for s in offloaded), default=0)
        update = device_update_bytes(width, grad_itemsize)
        budget = device_budget_bytes(free, excess, total, update)
        if self.agree is not None:  # Note [Every rank places the same tiers]
            budget = int(self.agree([budget], "min")[0])
        element_bytes = sum(d.itemsize for d in kind_dtypes)
        candidates = [(s.hi - s.lo, s.on_disk) for s in offloaded]
        moving = [offloaded[i] for i in choose(candidates, budget, element_bytes)]
        self.inputs = {
            "free_bytes": free,
            "step_excess_bytes": excess,
            "total_bytes": total,
            "update_bytes": update,
            "budget_bytes": budget,
            "moved_elements": sum(s.hi - s.lo for s in moving),
        }
        if not moving:
            logger.info(
                '%s "auto": %.2f GiB free on %s, %.2f GiB of it needed by a step: no optimizer '
                "sub-group fits there",
                KEY,
                free / 2**30,
                self.home,
                excess / 2**30,
            )
            return None
        from_disk = [s.on_disk for s in moving]
        tier, refused = None, None
        try:
            tier = DeviceTier(moving, kind_dtypes, self.home, key=KEY)
        except torch.OutOfMemoryError as exc:
            refused = str(exc)
        if self.agree is not None:
            # A tier one rank could not allocate is allocated on none: the ranks keep one
            # placement (Note [Every rank places the same tiers]).
            if self.agree([0.0 if refused else 1.0], "min")[0] < 1.0 and refused is None:
                refused = "another rank could not allocate it"
                tier = None
        if refused is not None or tier is None:
            for s in moving:
                s.dev = None
            self.inputs["refused"] = refused
            logger.warning('%s "auto": nothing moved to the device: %s', KEY, refused)
            return None
        for s, on_disk in zip(moving, from_disk):
            move(s, on_disk)
        logger.info(
            '%s "auto": %d optimizer sub-groups (%d elements, %.2f GiB of state; %d from NVMe) '
            "moved to %s: %.2f GiB free there, less %.2f GiB a step holds above what it "
            "leaves, %.2f GiB for their update and the reserve",
            KEY,
            len(moving),
            tier.elements,
            tier.state_bytes / 2**30,
            sum(from_disk),
            self.home,
            free / 2**30,
            excess / 2**30,
            update / 2**30,
        )
        return tier
