"""The placement decisions of the tiers, pure functions of sizes, read counts and budgets
(Note [Optimizer tiers], Note [Parameter shards in host memory] and Note [The device tier
from a measured step] in the package docstring): which optimizer sub-groups go to host
memory (`place`, `plan`), which parameter shards (`place_shards`), which sub-groups to the
device (`count_within`, `choose`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import List, Sequence, Tuple, Union

from ...sizing import optimizer_state_bytes

logger = logging.getLogger("zerostream")

HOST, NVME = "host", "nvme"
# offload_optimizer.ratio's share (Note [The device tier] in offload/device_tier.py).
DEVICE = "device"
STATE_BYTES = optimizer_state_bytes(False, False)  # fp32 master and Adam moments: 12


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


def plan(
    sizes: Sequence[int], max_in_cpu: Union[int, str], element_bytes: int = STATE_BYTES
) -> TierPlan:
    """The placement for `zerostream.optimizer_max_in_cpu` (elements, or "auto") when the
    optimizer is built: "auto" starts all on NVMe and is placed after a measured step by
    the placer (Note ["auto" is sized from a measured step])."""
    if max_in_cpu == "auto":
        return place(sizes, 0, '"auto": sized after the first step', element_bytes)
    result = place(
        sizes, int(max_in_cpu), f"zerostream.optimizer_max_in_cpu {max_in_cpu}", element_bytes
    )
    if result.host_elements:
        logger.info(result.describe())
    return result


def count_within(sizes: Sequence[int], max_elements: int) -> int:
    """How many of `sizes` (sub-groups in step order), taken from the first, fit within
    `max_elements`."""
    used = n = 0
    for size in sizes:
        if used + size > max_elements:
            break
        used, n = used + size, n + 1
    return n


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
