"""What "auto" may place, side by side: the host budget (this rank's share of the usable host
memory less a step's measured excess and the host reserve) and the device budget (what the
device can still give less the measured step's excess, the tier's update and the device
reserve). Both reserves are here so they can be read together: each leaves room for what
one measured step did not show, sized to its memory (Note ["auto" is sized from a measured
step], Note [The device tier from a measured step]).
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

from ...comm import ranks_on_this_host
from ...ops.device_adam import CHUNK
from ..memory_preflight import usable_host_bytes

# Host: a fixed part and a share that grows with the machine, for what the first step did
# not show (a checkpoint save, the page cache).
AUTO_RESERVE_BYTES = 1 << 30
AUTO_RESERVE_SHARE = 0.05
# Device: a fixed part and a share of the device (the caching allocator rounds and
# fragments; a later step may peak higher than the measured one). Smaller than the host's:
# nothing else of the run (page cache, a checkpoint's buffers) lands in device memory.
DEVICE_RESERVE_BYTES = 256 << 20
DEVICE_RESERVE_SHARE = 0.05
# Device Adam's fp32 temporaries per element of a chunk: the widened gradient and its
# scaled copy, m's increment, the denominator, and widened copies of 16-bit state.
ADAM_TEMP_BYTES = 8 * 4


def auto_budget_bytes(usable_bytes: Optional[int], ranks_on_host: int, other_bytes: int) -> int:
    """What "auto" may keep in host memory: this rank's share of the usable host memory, less
    the reserve (AUTO_RESERVE_*) and `other_bytes` (a step's excess, or what the other tier
    will take); 0 when nothing could be read (stay on disk, as configured)."""
    if usable_bytes is None:
        return 0
    share = usable_bytes // max(1, ranks_on_host)
    return max(0, share - AUTO_RESERVE_BYTES - int(AUTO_RESERVE_SHARE * share) - other_bytes)


def measured_budget_bytes(
    excess: int,
    *,
    heap_retained: bool = False,
    other_bytes: int = 0,
    reading: Optional[Tuple[Optional[int], str]] = None,
    agree: Optional[Callable] = None,
) -> Tuple[int, str]:
    """(what "auto" may keep in host memory now, between two steps, where that comes from):
    this rank's share of the usable host memory (`reading`, the caller's (bytes, where) from
    usable_host_bytes, or read now), less `excess` (what a step was measured to need above
    what it leaves: StepWindow.excess), the reserve and `other_bytes`. While host_malloc
    "retain" holds (`heap_retained`) the heap it keeps, about a step's excess, is left out
    too. With `agree` (comm.agreement), the smallest of the ranks' budgets: every rank then
    places the same shards and sub-groups (Note [Every rank places the same tiers])."""
    usable, where = usable_host_bytes() if reading is None else reading
    ranks = ranks_on_this_host()
    # "retain" keeps a step's freed heap (about its excess) resident, and its valve wants a
    # step's excess free at each step's end besides (Note [Fresh pages cost more than the
    # math] in host_malloc.py): both are left out of the tiers.
    heap = excess if heap_retained else 0
    budget = auto_budget_bytes(usable, ranks, excess + heap + other_bytes)
    agreed = ""
    if agree is not None:
        # Every rank calls this at the same point, reading or not: a rank without a
        # reading (budget 0) keeps every rank on disk.
        smallest = int(agree([budget], "min")[0])
        if smallest < budget:
            agreed = f"; {smallest / 2**30:.2f} GiB, the smallest of the ranks' budgets"
        budget = smallest
    if usable is None:
        return 0, '"auto": no host-memory reading' + agreed
    return budget, (
        f'"auto": {where} {usable / 2**30:.2f} GiB'
        + (f" shared by {ranks} ranks" if ranks > 1 else "")
        + f", less {excess / 2**30:.2f} GiB a step needs above what it leaves (measured)"
        + (', as much again for the heap "retain" keeps' if heap else "")
        + (f" and {other_bytes / 2**30:.2f} GiB taken since" if other_bytes else "")
        + agreed
    )


def device_update_bytes(width: int, grad_itemsize: int) -> int:
    """Device bytes a device sub-group's update needs besides its state: the buffer its
    gradients are uploaded into and device Adam's temporaries."""
    return width * grad_itemsize + min(width, CHUNK) * ADAM_TEMP_BYTES


def device_budget_bytes(free: int, excess: int, total: int, update: int) -> int:
    """Device bytes "auto" may give the tier: `free` (what the device can still give) less
    `excess` (what the measured step held above its steady state), `update` and the
    reserve; never negative."""
    reserve = DEVICE_RESERVE_BYTES + int(DEVICE_RESERVE_SHARE * total)
    return max(0, free - excess - update - reserve)
