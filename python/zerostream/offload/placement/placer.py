"""The placer: one per stage optimizer, the owner of its measuring window and of the order in
which "auto" host tiers take host memory (Note [Which tier first]). It talks to the tiers
through HostTier: what each holds on disk, what its disk cost the last step, and "move in
what fits this budget". The parameter shards and the optimizer state never see each other.

Pure given its readings: the window's excess, the usable host memory and the agreement
(`agree`, comm.agreement over the data-parallel group, None with one rank) are its inputs,
so it is tested with stand-in tiers and a stand-in reading (tests/python/offload/
test_placer.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Optional, Protocol, Tuple

from ..memory_preflight import ENV, memory_status, usable_host_bytes
from .budgets import measured_budget_bytes
from .window import StepWindow

logger = logging.getLogger("zerostream")

# Note [Which tier first].
MIN_REORDER_WAIT_S = 0.25
REORDER_MARGIN = 1.5


class HostTier(Protocol):
    """A tier that "auto" places in host memory (the parameter shards' ParamSwapper, the
    optimizer state's SwappedAdam)."""

    @property
    def waiting_for_plan(self) -> bool:
        """True while it waits for a step to measure before it may place (the shards: a
        recorded stage-3 trace not yet run as planned); the other tier waits for it then."""
        ...

    def disk_bytes(self) -> int:
        """Host bytes its state still on disk would take if it all moved in."""
        ...

    def last_wait_seconds(self) -> float:
        """What the last step waited, unhidden, on this tier's disk reads and writes."""
        ...

    def disk_bytes_written(self) -> int:
        """Bytes it has written to disk so far (the step's traffic, for its prediction)."""
        ...

    def move_in(self, budget_bytes: int, source: str) -> int:
        """Moves what fits `budget_bytes` from disk into host memory, for good (the tier
        chooses what: the most-read shards, sub-groups spread over the step); returns the
        host bytes it holds now. `source` says where the budget came from (its log)."""
        ...


@dataclass(frozen=True)
class Placement:
    """The readings a tier was placed from (its step prediction reads them)."""

    rss_bytes: Optional[int]  # the RSS it placed at
    excess_bytes: int  # a step's measured excess (Note [A step's excess])
    usable_bytes: Optional[int]  # None: nothing could be read, all stays on disk
    budget_bytes: int
    source: str
    held_bytes: int  # what the tier holds in host memory after the move


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


Reading = Callable[[], Tuple[Optional[int], str]]


@dataclass(frozen=True)
class Move:
    """A tier's move into host memory: when it ended (perf_counter), what it took, and the
    share of its disk bytes left on disk after it (Note [Predicting the placed step])."""

    ended_at: float
    seconds: float
    disk_share_after: float


class Placer:
    """Enrolled "auto" host tiers wait in the window until each is placed (`place`); the
    stage calls `step_ended` after every optimizer step (the engine's one call)."""

    def __init__(
        self,
        window: Optional[StepWindow] = None,
        agree: Optional[Callable] = None,
        reading: Reading = usable_host_bytes,
    ):
        self.window = window if window is not None else StepWindow()
        self.agree = agree
        self.reading = reading
        self.shards: Optional[HostTier] = None  # offload_param max_in_cpu "auto"
        self.optimizer: Optional[HostTier] = None  # zerostream.optimizer_max_in_cpu "auto"
        self.shards_held = 0  # what the shards took, once placed
        self.shards_move: Optional[Move] = None
        self.optimizer_goes_first = False
        self.order_inputs: Optional[dict] = None  # what the order was decided from

    # --- enrolment -------------------------------------------------------------------------------
    def attach_shards(self, tier: HostTier, auto: bool) -> None:
        """The stage-3 parameter shards on disk (offload_param "nvme"): their disk traffic
        is part of the optimizer's step prediction; with max_in_cpu "auto" they wait in the
        window to be placed."""
        self.shards = tier
        if auto:
            self.window.wait_for_me(tier)

    def attach_optimizer(self, tier: HostTier, auto: bool) -> None:
        """The sub-grouped optimizer state; with optimizer_max_in_cpu "auto" it waits in
        the window to be placed."""
        self.optimizer = tier
        if auto:
            self.window.wait_for_me(tier)

    def pending(self, tier: Optional[HostTier]) -> bool:
        """Whether `tier` is enrolled and still to be placed."""
        return tier is not None and tier in self.window.waiting

    def withdraw(self, tier: HostTier) -> None:
        """`tier` closes (the run ends): no placement follows, the windows stop for it."""
        self.window.done(tier)

    def optimizer_may_place(self, steps_here: int) -> bool:
        """Whether the optimizer's "auto" may place now (after `steps_here` steps): the
        shards go first, unless they never will. Without a stage-3 trace they never place,
        so the optimizer places at its fourth step at the latest, unless a recorded trace
        still waits for its planned step (`waiting_for_plan`: a trace recorded again after
        an abandoned plan; the shards choose after it)."""
        shards = self.shards
        if shards is None or not self.pending(shards):
            return True
        return steps_here >= 3 and not shards.waiting_for_plan

    def shard_bytes_written(self) -> int:
        """What the parameter shards wrote to disk so far (0 without a shards tier)."""
        return self.shards.disk_bytes_written() if self.shards is not None else 0

    def step_ended(self) -> None:
        """After an optimizer step: the window closes while a tier waits (Note [A step's
        excess])."""
        self.window.step_ended()

    # --- placing ---------------------------------------------------------------------------------
    def _claim_first(self, shards: HostTier) -> int:
        """The host bytes the optimizer claims before the shards (its whole disk state), or
        0: it takes what they leave (Note [Which tier first]). The slowest rank's waits
        decide, on every rank."""
        opt = self.optimizer
        if opt is None or not self.pending(opt):
            return 0
        param_wait, param_disk = shards.last_wait_seconds(), shards.disk_bytes()
        opt_wait, opt_disk = opt.last_wait_seconds(), opt.disk_bytes()
        if self.agree is not None:
            param_wait, opt_wait = self.agree([param_wait, opt_wait], "max")
        self.optimizer_goes_first = optimizer_first(param_wait, param_disk, opt_wait, opt_disk)
        self.order_inputs = {
            "optimizer_wait_seconds": opt_wait,
            "optimizer_disk_bytes": opt_disk,
            "param_wait_seconds": param_wait,
            "param_disk_bytes": param_disk,
        }
        logger.info(
            '"auto" tiers: the last step waited %.2f s on %.2f GiB of optimizer state and '
            "%.2f s on %.2f GiB of parameter shards on disk: %s first",
            opt_wait,
            opt_disk / 2**30,
            param_wait,
            param_disk / 2**30,
            "the optimizer state" if self.optimizer_goes_first else "the shards",
        )
        return opt_disk if self.optimizer_goes_first else 0

    def place(self, tier: HostTier) -> Placement:
        """Places `tier` now, between two steps: its budget is this rank's share of the
        usable host memory less the window's excess, the reserve and what the other tier
        claims or took (agreed over the ranks), and the tier moves in what fits."""
        self.window.done(tier)
        other = self._claim_first(tier) if tier is self.shards else 0
        self.window.before_placing()  # the RSS of a step's end (Note [A step's excess])
        rss, excess = memory_status().get("VmRSS"), self.window.excess()
        usable, where = self.reading()
        if tier is self.optimizer and where == ENV:
            # A fixed override of the usable memory does not drop as the shards' arena
            # fills, unlike MemAvailable or the cgroup's room: counted here instead.
            other = self.shards_held
        budget, source = measured_budget_bytes(
            excess,
            heap_retained=self.window.heap_retained(),
            other_bytes=other,
            reading=(usable, where),
            agree=self.agree,
        )
        disk_before, started = tier.disk_bytes(), time.perf_counter()
        held = tier.move_in(budget, source)
        if tier is self.shards:
            ended = time.perf_counter()
            self.shards_held = held
            self.shards_move = Move(ended, ended - started, 1.0 - held / max(1, disk_before))
        return Placement(rss, excess, usable, budget, source, held)
