"""`zerostream.optimizer_max_on_device`: the optimizer sub-groups kept and stepped on the compute
device, as an element count or "auto" sized from a measured step (Note [The device tier from
a measured step]).

Note [The device tier from a measured step]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
DeepSpeed sizes the device tier by hand (offload_optimizer.ratio, Note [The device tier] in
device_tier.py). zerostream.optimizer_max_on_device sizes it in elements per rank instead
(the first whole sub-groups in step order that fit, placed when the optimizer is built,
exactly as a ratio would place them), or "auto": the device memory a real step leaves.

With "auto" every sub-group starts offloaded (host memory or NVMe, as without a device
tier). The first optimizer step starts a measured interval: that step, the next forward and
backward. At the start of the second optimizer step the accelerator says what the device can
still give this process (the driver's free memory plus the blocks the caching allocator
holds unused) and what the interval held above what is held now (gathered parameters,
activations, the step's transients: the next iteration needs them again). The budget is the
first less the second, less what the tier's own update needs (one gradient buffer as wide as
the widest sub-group, and the device Adam's fp32 temporaries), less a reserve
(DEVICE_RESERVE_*: the caching allocator's fragmentation, and what a later step may hold
more). Whole sub-groups move into it: those on
NVMe first (an element there costs 24 bytes of disk traffic a step and the CPU kernel's
update), in step order, then host-tier ones (the CPU kernel's update only; their host arena
is not given back). The move reads each from where it is and frees its disk extents; it
happens before the host tier's own "auto" when both place at the same step, so the host
budget goes to what the device did not take.

Their gradients land in the host partition and go up for the update (what
zerostream.device_tier_grads "host" does for a ratio): the reducer's landing and the pinned
gradient partitions were sized when the engine was built, and keeping a device tier's
gradients on the device means partitions without its elements (Note [Device-tier gradients
stay on the device]). An element count places at build time, so it follows
device_tier_grads like a ratio.

The interval's peak is the accelerator's (torch.cuda.max_memory_allocated on a GPU), so
"auto" resets the allocator's peak statistics at the first optimizer step: a script reading
max_memory_allocated across that step sees the peak since then.

If the device cannot allocate the chosen tier after all, nothing has moved yet: a warning,
and the state stays where it was. Where the device's memory is the host's (a run without a
GPU), "auto" places nothing and says so: a device tier there would only move state from one
part of host memory to another. On the simulated device (testing/sim_device.py) the memory
model's capacity stands for the GPU's, and holding more than it is reported as a violation.
"""

from __future__ import annotations

import gc
import logging
from typing import Callable, List, Optional, Sequence, Tuple

import torch

from ..ops.device_adam import CHUNK
from .device_tier import DeviceTier
from .memory_preflight import skewed

logger = logging.getLogger("zerostream")

KEY = "zerostream.optimizer_max_on_device"
# What "auto" leaves free on the device beyond a measured step's needs: a fixed part and a
# share of the device (the caching allocator rounds and fragments; a later step may peak
# higher than the measured one).
DEVICE_RESERVE_BYTES = 256 << 20
DEVICE_RESERVE_SHARE = 0.05
# Device Adam's fp32 temporaries per element of a chunk: the widened gradient and its
# scaled copy, m's increment, the denominator, and widened copies of 16-bit state.
ADAM_TEMP_BYTES = 8 * 4


def count_within(sizes: Sequence[int], max_elements: int) -> int:
    """How many of `sizes` (sub-groups in step order), taken from the first, fit within
    `max_elements`."""
    used = n = 0
    for size in sizes:
        if used + size > max_elements:
            break
        used, n = used + size, n + 1
    return n


def update_bytes(width: int, grad_itemsize: int) -> int:
    """Device bytes a device sub-group's update needs besides its state: the buffer its
    gradients are uploaded into and device Adam's temporaries."""
    return width * grad_itemsize + min(width, CHUNK) * ADAM_TEMP_BYTES


def budget_bytes(free: int, excess: int, total: int, update: int) -> int:
    """Device bytes "auto" may give the tier: `free` (what the device can still give) less
    `excess` (what the measured step held above its steady state), `update` and the
    reserve; never negative."""
    reserve = DEVICE_RESERVE_BYTES + int(DEVICE_RESERVE_SHARE * total)
    return max(0, free - excess - update - reserve)


def choose(candidates: Sequence[Tuple[int, bool]], budget: int, element_bytes: int) -> List[int]:
    """Positions in `candidates` ((elements, on disk) per offloaded sub-group, in step
    order) to move to the device within `budget` bytes: on-disk ones first, then host
    ones, each in step order, a sub-group that does not fit skipped for later smaller ones."""
    order = [i for i, c in enumerate(candidates) if c[1]]
    order += [i for i, c in enumerate(candidates) if not c[1]]
    chosen, used = [], 0
    for i in order:
        nbytes = candidates[i][0] * element_bytes
        if used + nbytes <= budget:
            chosen.append(i)
            used += nbytes
    return sorted(chosen)


def build(
    sub_groups: list, kind_dtypes, home: torch.device, ratio: float, max_on_device
) -> Optional[DeviceTier]:
    """The device tier placed when the optimizer is built: the first sub-groups in step order
    that offload_optimizer.ratio keeps (DeepSpeed's rule) or that fit an element count of
    zerostream.optimizer_max_on_device; None without one ("auto" places later)."""
    from .device_tier import RATIO_KEY, device_count

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


class DeviceAutoPlacement:
    """The "auto" device tier of SwappedAdam (offload/optimizer_swap.py), mixed in: uses its
    `sub_groups`, `kind_dtypes`, `element_bytes`, staging (`_staged`), `take_out_of_store`
    and `device_tier`."""

    def _init_device_auto(self, max_on_device, device: Optional[torch.device]) -> None:
        self.device_auto_pending = max_on_device == "auto"
        self.device_home = device if device is not None else torch.device("cpu")
        self.device_inputs: Optional[dict] = None  # what place_on_device decided from
        # Set by stage 3: whether the step under way ran the recorded trace's plan (its
        # prefetches make the peak a step needs; the recording step, or one that left its
        # trace, gathers less at once). The same on every rank (the trace is agreed).
        self.step_planned: Optional[Callable[[], bool]] = None

    def device_auto_at_step(self, grad_itemsize: int) -> bool:
        """At the start of each optimizer step while "auto" is pending: the first starts the
        measured interval (a whole iteration: this optimizer step, the next forward and
        backward), the second places the tier. Whether sub-groups moved."""
        from ..accelerator import get_accelerator

        if not self.device_auto_pending:
            return False
        if self.steps_here == 0 or (self.step_planned is not None and not self.step_planned()):
            # The interval starts (again): a step that did not run the stage-3 plan would
            # size the tier from too small a peak, and it ran out of memory later.
            get_accelerator().reset_memory_peak()
            return False
        return self.place_on_device(grad_itemsize) > 0

    def place_on_device(self, grad_itemsize: int) -> int:
        """ "auto", at the start of an optimizer step after a measured one: the offloaded
        sub-groups that fit the device memory it leaves move there, for good. Returns how
        many moved."""
        from ..accelerator import get_accelerator

        self.device_auto_pending = False
        gc.collect()  # tensors only a reference cycle holds are not the step's needs
        room = get_accelerator().memory_room()
        if room is None:
            self.device_inputs = {"source": "the device's memory is the host's"}
            logger.info(
                '%s "auto": the compute device (%s) has no memory of its own; every optimizer '
                "sub-group stays offloaded",
                KEY,
                self.device_home,
            )
            return 0
        free, excess, total = room
        free, excess = skewed(free, "device_free"), skewed(excess, "device_excess")
        offloaded = [s for s in self.sub_groups if s.dev is None]
        width = max((s.hi - s.lo for s in offloaded), default=0)
        update = update_bytes(width, grad_itemsize)
        budget = budget_bytes(free, excess, total, update)
        if self.agree is not None:  # Note [Every rank places the same tiers] in tiers.py
            budget = int(self.agree([budget], "min")[0])
        candidates = [(s.hi - s.lo, s.on_disk) for s in offloaded]
        moving = [offloaded[i] for i in choose(candidates, budget, self.element_bytes)]
        self.device_inputs = {
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
                self.device_home,
                excess / 2**30,
            )
            return 0
        from_disk = [s.on_disk for s in moving]
        tier, refused = None, None
        try:
            tier = DeviceTier(moving, self.kind_dtypes, self.device_home, key=KEY)
        except torch.OutOfMemoryError as exc:
            refused = str(exc)
        if self.agree is not None:
            # A tier one rank could not allocate is allocated on none: the ranks keep one
            # placement (Note [Every rank places the same tiers] in tiers.py).
            if self.agree([0.0 if refused else 1.0], "min")[0] < 1.0 and refused is None:
                refused = "another rank could not allocate it"
                tier = None
        if refused is not None:
            for s in moving:
                s.dev = None
            self.device_inputs["refused"] = refused
            logger.warning('%s "auto": nothing moved to the device: %s', KEY, refused)
            return 0
        for s, on_disk in zip(moving, from_disk):
            self._move_to_device(s, on_disk)
        self.device_tier = tier
        logger.info(
            '%s "auto": %d optimizer sub-groups (%d elements, %.2f GiB of state; %d from NVMe) '
            "moved to %s: %.2f GiB free there, less %.2f GiB a step holds above what it "
            "leaves, %.2f GiB for their update and the reserve",
            KEY,
            len(moving),
            tier.elements,
            tier.state_bytes / 2**30,
            sum(from_disk),
            self.device_home,
            free / 2**30,
            excess / 2**30,
            update / 2**30,
        )
        return len(moving)

    def _move_to_device(self, s, on_disk: bool) -> None:
        """Sub-group `s`'s state into its device tensors (s.dev, just allocated), from the
        swap store through staging slot 0 (its extents freed) or from the host tier
        (its arena bytes stay with the arena). Blocking copies: the staging slot is reused
        for the next one."""
        if on_disk:
            staged = self._staged(0, s.hi - s.lo)
            self.take_out_of_store(s, staged)
            for dev, t in zip(s.dev, staged):
                dev.copy_(t)
        else:
            for dev, t in zip(s.dev, s.host):
                dev.copy_(t)
            s.host = None
