"""Where each optimizer sub-group's state lives under offload_optimizer nvme: host memory or
the swap files (Note [Optimizer tiers]).

Note [Optimizer tiers]
~~~~~~~~~~~~~~~~~~~~~~
A sub-group on NVMe costs its 12 bytes an element (fp32 master, exp_avg, exp_avg_sq) read
and written again every step: 24 bytes an element per step over the disk, the link that
bounds an NVMe-offloaded step. A sub-group in host memory costs 12 bytes an element of RAM
once and no disk traffic. So every element moved to the host tier takes 24 bytes per step
off the disk, whichever sub-group it is in; the tiers hold whole sub-groups (the unit the
step streams), and the host ones are spread evenly over the step order so that the disk
reads the next NVMe sub-group while the CPU updates host ones.

The host tier's size is `zerostream.optimizer_max_in_cpu` (elements per rank, like
DeepSpeed's offload_param.max_in_cpu; 0, the default, is DeepSpeed's all-on-NVMe), or
"auto". The placement changes no result: Adam is elementwise and every sub-group runs the
same kernel in the same order.

Note ["auto" is sized from a measured step]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Before a step has run, the memory a step needs on top of what it leaves behind (gathered
parameters, activations, staging, the allocator's slack) is a guess, and so are the pages of
buffers allocated but not yet touched (a gradient partition is resident only once written).
A guess too small fills RAM (the 3.17 B run of benchmarks/capacity.md peaked at 21.6 of 23.5
GiB and ran slower than all on NVMe); one too large gives the win away. So "auto" decides
after a measured step: everything starts on disk; when a step has run the stage-3 trace's
whole plan (the recording step has no prefetches and read-ahead, and a smaller peak; so has
a step whose plan was abandoned, and a budget measured on either had the same 3.17 B run
killed for memory), what this rank may still allocate (memory_preflight.usable_host_bytes,
MemAvailable or the cgroup's room, shared by the ranks of this host) less that step's
measured excess (its peak RSS less the RSS it left, over whole steps: Note [A step's
excess]) less a small reserve (AUTO_RESERVE_*) is the budget. The parameter shards take it
first (a byte of a shard saves more disk traffic than a byte of optimizer state, below),
unless the measured step says the optimizer's disk time costs more per byte (Note [Which
tier first]); the optimizer state's sub-groups wait for them (while a recorded trace waits for its
planned step too) and move into host memory at the next optimizer step, from what the
shards left free. Moving costs one read of what moves, once; the disk extents they leave
are freed.

Note [Every rank places the same tiers]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Each rank reads its own free memory, its own step's peak and its own waits, and two ranks on
one host rarely read the same. A placement made from them differed between ranks, and it
shapes the collectives: a stage-3 prefetch whose shards all live in host memory issues its
all-gather at once, one with a shard on disk later, so two ranks that kept different shards
issued the gathers and reduce-scatters in between in different orders (Gloo aborted, NCCL
would hang). So every "auto" decision is made from agreed numbers, one all-reduce at the
point every rank places (comm.agree, handed in as `agree`): the smallest of the ranks'
budgets (host memory, device memory), the largest of their measured waits (which tier goes
first), and a device tier that could not be allocated on one rank is allocated on none. The
rest of a placement is a function of those and of sizes and read counts every rank shares.
`ZEROSTREAM_TEST_SKEW` skews the readings per rank in tests (memory_preflight.skewed).

Note [Predicting the placed step]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
When the optimizer's "auto" places its tier it logs the step time it expects. Two measured
parts, each scaled by what the placement changes:
- forward and backward: the time from the end of the last optimizer step to this one, less
  the parameter shards' one-time move into host memory if it happened in it (the shards'
  "auto" runs at a forward's start, before the optimizer's: that forward already runs with
  the shards where they will stay);
- the optimizer step: the last one's time, times the disk bytes the step will move over
  those it moved (optimizer state read and written, and the updated parameter shards it
  wrote to disk). Its pipeline overlaps the reads, the writes and the kernel, so a step
  whose state is mostly on disk takes as long as its slowest stream, which scales with the
  bytes, but never below the part of the last step that did not wait on the disk (the
  kernel, which still updates every element).
A prediction from the whole last interval less the optimizer's wait only was 1.5x off, as
that interval held the shards' move and the parameter writes the placement removed.
It also logs the placed steps' peak RSS it expects: the RSS it placed at (the shards placed
before it included), plus the bytes it placed, plus the measured step's excess (Note [A
step's excess]); and its ceiling, that RSS plus the excess plus the whole budget, which
leaves only the reserve free. `bench capacity` measures the placed steps' own peak against
both (without the prediction, the largest run of benchmarks/capacity.md peaked 2.5% over
the bench's formula with nothing to say whether "auto" or the formula was off).

Note [Parameter shards in host memory]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
offload_param.max_in_cpu keeps DeepSpeed's meaning (the first N elements of shards stay in
host memory) and also takes "auto": every shard goes to disk at first; once the stage-3
trace is recorded and the next step has run its plan, the shards read most often in it (a
tied embedding more often than a layer's weight) are read back into a page-locked arena
while they fit what this rank may still use, less a step's measured excess and the reserve
(Note ["auto" is sized from a measured step]). Per byte of RAM a 16-bit shard saves more
disk traffic than optimizer state (read in forward and backward, written after the step: 6
bytes a step for 2 held, against 24 for 12), so an optimizer tier that is also "auto" is
placed after them, unless the step says otherwise (Note [Which tier first]).

Note [Which tier first]
~~~~~~~~~~~~~~~~~~~~~~~
Bytes of traffic saved are not seconds saved. The shards are read ahead of the layer that
needs them, and the compute of the forward and backward hides those reads; the optimizer
step streams its sub-groups through the CPU kernel with little to hide them behind. On the
3.17 B fp32 run of benchmarks/capacity.md the shards, placed first by bytes, saved
nothing: the step waited 150 of 215 s on the optimizer stream. So when both tiers are
"auto", the measured step decides: each tier's unhidden wait in it (the time the host
waited on that tier's reads and writes) per byte that tier holds on disk is the step time a
byte of RAM buys back there. The optimizer goes first when its wait is significant
(MIN_REORDER_WAIT_S: below that a reorder cannot pay for itself, and tiny test steps stay
in the default order whatever their timer noise) and at least REORDER_MARGIN times the
shards' per byte: the shards then see a budget less the optimizer's whole disk state
(which it takes at its next step), and take what is left.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple, Union

logger = logging.getLogger("zerostream")

HOST, NVME = "host", "nvme"
DEVICE = "device"  # offload_optimizer.ratio's share (Note [The device tier] in device_tier.py)
STATE_BYTES = 12  # fp32 master + exp_avg + exp_avg_sq, per element (bf16 masters: 6 or 10)
# "auto" leaves this much of the usable host memory on top of the measured excess of a step
# (Note ["auto" is sized from a measured step]): a fixed part and a share that grows with
# the machine, for what the first step did not show (a checkpoint save, the page cache).
AUTO_RESERVE_BYTES = 1 << 30
AUTO_RESERVE_SHARE = 0.05
# Note [Which tier first].
MIN_REORDER_WAIT_S = 0.25
REORDER_MARGIN = 1.5


@dataclass(frozen=True)
class TierPlan:
    """The placement of a rank's sub-groups and what it moves per step."""

    tiers: List[str]  # HOST or NVME, one per sub-group in step order
    host_elements: int
    nvme_elements: int
    budget_elements: int  # what the placement was allowed to put in host memory
    source: str  # where the budget came from: the config key or the memory reading
    element_bytes: int = STATE_BYTES  # master + moments, per element

    @property
    def host_bytes(self) -> int:
        return self.element_bytes * self.host_elements

    @property
    def disk_bytes_per_step(self) -> int:
        """Optimizer-state bytes read plus written per step."""
        return 2 * self.element_bytes * self.nvme_elements

    def describe(self) -> str:
        n_host = self.tiers.count(HOST)
        total = self.host_elements + self.nvme_elements
        return (
            f"optimizer state tiers: {n_host} of {len(self.tiers)} sub-groups in host memory "
            f"({self.host_elements} of {total} elements, {self.host_bytes / 2**30:.2f} GiB; "
            f"budget {self.budget_elements} elements from {self.source}), "
            f"{len(self.tiers) - n_host} on NVMe: {self.disk_bytes_per_step / 1e9:.2f} GB "
            f"read+written per step (all on NVMe: {2 * self.element_bytes * total / 1e9:.2f} GB)"
        )


def place(
    sizes: Sequence[int], budget_elements: int, source: str = "", element_bytes: int = STATE_BYTES
) -> TierPlan:
    """Whole sub-groups (`sizes`, in step order) to host memory within `budget_elements`,
    spread over the order: a sub-group goes to the host when the host tier is behind its
    even share of the elements seen so far, and a last pass fills what is left of the
    budget with the largest NVMe sub-groups that still fit."""
    total = sum(sizes)
    budget = max(0, min(int(budget_elements), total))
    share = budget / total if total else 0.0
    tiers = [NVME] * len(sizes)
    used = seen = 0
    for i, n in enumerate(sizes):
        seen += n
        if used + n <= budget and used + n / 2 <= share * seen:
            tiers[i], used = HOST, used + n
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        if tiers[i] == NVME and used + sizes[i] <= budget:
            tiers[i], used = HOST, used + sizes[i]
    return TierPlan(tiers, used, total - used, budget, source, element_bytes)


def optimizer_first(
    param_wait_s: float, param_disk_bytes: int, opt_wait_s: float, opt_disk_bytes: int
) -> bool:
    """Whether the optimizer's "auto" tier takes the budget before the parameter shards'
    (Note [Which tier first]): waits are one measured step's, bytes what each tier holds on
    disk."""
    if opt_wait_s < MIN_REORDER_WAIT_S or opt_disk_bytes <= 0:
        return False
    if param_disk_bytes <= 0:
        return True
    return opt_wait_s / opt_disk_bytes >= REORDER_MARGIN * param_wait_s / param_disk_bytes


def predict_step(
    forward_backward_s: float,
    optimizer_s: float,
    optimizer_wait_s: float,
    disk_bytes_before: int,
    disk_bytes_after: int,
) -> dict:
    """The step time "auto" expects once its tiers are placed (Note [Predicting the placed
    step]): the forward and backward as just measured, plus the last optimizer step scaled
    by the disk bytes it will move against those it moved, never below the part of it that
    did not wait on the disk."""
    scale = disk_bytes_after / disk_bytes_before if disk_bytes_before > 0 else 1.0
    optimizer_after = max(optimizer_s * scale, optimizer_s - optimizer_wait_s)
    return {
        "forward_backward_seconds": round(forward_backward_s, 3),
        "last_optimizer_step_seconds": round(optimizer_s, 3),
        "optimizer_wait_seconds": round(optimizer_wait_s, 3),
        "optimizer_disk_bytes_before": int(disk_bytes_before),
        "optimizer_disk_bytes_after": int(disk_bytes_after),
        "predicted_optimizer_step_seconds": round(optimizer_after, 3),
        "predicted_step_seconds": round(forward_backward_s + optimizer_after, 3),
    }


def predict_peak_rss(
    rss_bytes: Optional[int], excess_bytes: int, placed_bytes: int, budget_bytes: Optional[int]
) -> dict:
    """The placed steps' peak RSS "auto" expects (Note [Predicting the placed step]): the RSS
    it placed at, plus what it placed, plus the measured step's excess; and the ceiling it
    allowed itself (the RSS plus the excess plus the whole budget: what leaves only the
    reserve; none where no budget was read). {} where the RSS could not be read."""
    if rss_bytes is None:
        return {}
    out = {
        "rss_at_placement_bytes": int(rss_bytes),
        "step_excess_bytes": int(excess_bytes),
        "placed_bytes": int(placed_bytes),
        "predicted_peak_rss_bytes": int(rss_bytes + excess_bytes + placed_bytes),
    }
    if budget_bytes is not None:
        out["host_ceiling_bytes"] = int(rss_bytes + excess_bytes + budget_bytes)
    return out


def auto_budget_bytes(usable_bytes: Optional[int], ranks_on_host: int, other_bytes: int) -> int:
    """What "auto" may keep in host memory: this rank's share of the usable host memory, less
    the reserve (AUTO_RESERVE_*) and `other_bytes` (staging, or what the other tier will
    take); 0 when nothing could be read (stay on disk, as configured)."""
    if usable_bytes is None:
        return 0
    share = usable_bytes // max(1, ranks_on_host)
    return max(0, share - AUTO_RESERVE_BYTES - int(AUTO_RESERVE_SHARE * share) - other_bytes)


def usable_share() -> tuple:
    """(bytes this process may still allocate or None, where that comes from, ranks here)."""
    from ..comm import ranks_on_this_host
    from .memory_preflight import usable_host_bytes

    usable, where = usable_host_bytes()
    return usable, where, ranks_on_this_host()


def place_shards(reads: Sequence[int], sizes: Sequence[int], budget_bytes: int) -> List[int]:
    """Parameter shards to keep in host memory (Note [Parameter shards in host memory]):
    the indices of the most-read shards (`reads` per step, `sizes` in bytes) that fit
    `budget_bytes`, taken in order of reads (a tie keeps the earlier shard)."""
    chosen, used = [], 0
    for i in sorted(range(len(sizes)), key=lambda i: (-reads[i], i)):
        if used + sizes[i] <= budget_bytes:
            chosen.append(i)
            used += sizes[i]
    return sorted(chosen)


def measured_budget_bytes(
    other_bytes: int = 0,
    excess: Optional[int] = None,
    reading: Optional[tuple] = None,
    agree: Optional[Callable] = None,
) -> Tuple[int, str]:
    """(what "auto" may keep in host memory now, between two steps, where that comes from):
    this rank's share of the usable host memory (`reading`, the caller's (bytes, where) from
    usable_host_bytes, or read now), less the excess a step was measured to need (`excess`,
    or read now), the reserve and `other_bytes` (Note ["auto" is sized from a measured
    step]). With `agree` (comm.agreement), the smallest of the ranks' budgets: every rank
    then places the same shards and sub-groups (Note [Every rank places the same tiers])."""
    from ..comm import ranks_on_this_host
    from .memory_preflight import STEP_PEAKS, peak_above_now_bytes

    if reading is None:
        usable, where, ranks = usable_share()
    else:
        (usable, where), ranks = reading, ranks_on_this_host()
    if excess is None:
        excess = peak_above_now_bytes()
    # host_malloc "retain" keeps a step's freed heap (about its excess) resident, and its
    # valve wants a step's excess free at each step's end besides (Note [Fresh pages cost
    # more than the math] in host_malloc.py): both are left out of the tiers.
    heap = excess if STEP_PEAKS.heap_retained else 0
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


def plan(
    sizes: Sequence[int], max_in_cpu: Union[int, str], element_bytes: int = STATE_BYTES
) -> TierPlan:
    """The placement for `zerostream.optimizer_max_in_cpu` (elements, or "auto") when the
    optimizer is built: "auto" starts all on NVMe and is placed after a measured step by
    SwappedAdam.place_measured() (Note ["auto" is sized from a measured step])."""
    if max_in_cpu == "auto":
        return place(sizes, 0, '"auto": sized after the first step', element_bytes)
    result = place(
        sizes, int(max_in_cpu), f"zerostream.optimizer_max_in_cpu {max_in_cpu}", element_bytes
    )
    if result.host_elements:
        logger.info(result.describe())
    return result
