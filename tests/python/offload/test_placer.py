"""The placer (offload/placement/placer.py), pure given its readings: stand-in tiers and a
stand-in reading of the usable host memory, no engine, no disk, no simulated device.

- The order: with both tiers "auto" the shards place first and see the optimizer's whole
  disk state claimed only when its wait per byte is worth it (Note [Which tier first]), the
  slowest rank's waits deciding (an agreement that returns the max).
- The budget each tier is handed: the reading less the window's excess, the reserve, and
  what the other tier claimed or (under the fixed override) took; the smallest of the ranks'.
- The window: a tier waits in it until placed, the optimizer may place once the shards did
  (or at its fourth step while no stage-3 plan waits), and a withdrawn tier never places.
"""

import pytest

from zerostream.offload.memory_preflight import ENV
from zerostream.offload.placement import Placer, StepWindow, budgets

GIB = 1 << 30


class Tier:
    """A HostTier stand-in: its disk bytes and wait are given; move_in keeps what it is
    handed (up to its disk bytes) and records the budget."""

    waiting_for_plan = False

    def __init__(self, disk: int, wait: float, written: int = 0):
        self.disk, self.wait, self.written = disk, wait, written
        self.budgets: list = []

    def disk_bytes(self) -> int:
        return self.disk

    def last_wait_seconds(self) -> float:
        return self.wait

    def disk_bytes_written(self) -> int:
        return self.written

    def move_in(self, budget_bytes: int, source: str) -> int:
        self.budgets.append((budget_bytes, source))
        held = min(budget_bytes, self.disk)
        self.disk -= held
        return held


class Window(StepWindow):
    def __init__(self, excess: int):
        super().__init__()
        self.fixed = excess

    def excess(self) -> int:
        return self.fixed


def _placer(usable=20 * GIB, where="MemAvailable", excess=GIB, agree=None) -> Placer:
    return Placer(Window(excess), agree=agree, reading=lambda: (usable, where))


@pytest.fixture(autouse=True)
def one_rank_here(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")


def test_the_shards_place_first_with_the_budget_less_the_excess_and_the_reserve():
    placer, shards, opt = _placer(), Tier(4 * GIB, 1.0), Tier(30 * GIB, 0.1)
    placer.attach_shards(shards, True)
    placer.attach_optimizer(opt, True)
    assert placer.pending(shards) and placer.pending(opt)
    assert not placer.optimizer_may_place(1)  # the shards go first
    placed = placer.place(shards)
    expected = budgets.auto_budget_bytes(20 * GIB, 1, GIB)  # 20 - 1 - 5% - 1 GiB excess
    assert expected == 17 * GIB
    assert shards.budgets[0][0] == expected and placed.held_bytes == 4 * GIB
    assert not placer.optimizer_goes_first  # its 0.1 s is below the floor
    assert placer.order_inputs["optimizer_disk_bytes"] == 30 * GIB
    assert placer.optimizer_may_place(1) and not placer.pending(shards)
    placer.place(opt)
    # MemAvailable drops as the shards' arena fills: nothing is subtracted twice.
    assert opt.budgets[0][0] == expected


def test_an_optimizer_that_waits_longer_per_byte_claims_its_disk_state_first():
    placer, shards, opt = _placer(), Tier(8 * GIB, 0.5), Tier(6 * GIB, 30.0)
    placer.attach_shards(shards, True)
    placer.attach_optimizer(opt, True)
    placer.place(shards)
    assert placer.optimizer_goes_first
    assert shards.budgets[0][0] == 17 * GIB - 6 * GIB  # the optimizer's 6 GiB claimed


def test_the_slowest_rank_s_waits_and_the_smallest_budget_decide():
    calls = []

    def agree(values, op):  # another rank read a slow optimizer and less memory
        calls.append(op)
        return [max(v, 40.0) for v in values] if op == "max" else [min(values[0], 3 * GIB)]

    placer, shards, opt = _placer(agree=agree), Tier(16 * GIB, 0.5), Tier(6 * GIB, 0.1)
    placer.attach_shards(shards, True)
    placer.attach_optimizer(opt, True)
    placer.place(shards)
    assert calls == ["max", "min"]
    # Agreed waits are 40 s each: 40/6 GiB against 1.5 x 40/16 GiB: the optimizer first
    # (with its own 0.1 s it would not have been).
    assert placer.optimizer_goes_first
    assert shards.budgets[0][0] == 3 * GIB
    assert "the smallest of the ranks' budgets" in shards.budgets[0][1]


def test_under_the_fixed_override_the_optimizer_sees_what_the_shards_took():
    placer = _placer(usable=20 * GIB, where=ENV)
    shards, opt = Tier(4 * GIB, 1.0), Tier(30 * GIB, 0.1)
    placer.attach_shards(shards, True)
    placer.attach_optimizer(opt, True)
    placer.place(shards)
    placer.place(opt)
    assert opt.budgets[0][0] == 17 * GIB - 4 * GIB


def test_without_shards_to_wait_for_the_optimizer_places_and_a_withdrawn_tier_never_does():
    placer, opt = _placer(), Tier(GIB, 0.0)
    placer.attach_optimizer(opt, True)
    assert placer.optimizer_may_place(1)
    shards = Tier(GIB, 0.0, written=123)
    placer.attach_shards(shards, False)  # on disk, not "auto": counted, never placed
    assert not placer.pending(shards) and placer.shard_bytes_written() == 123
    assert placer.optimizer_may_place(1)
    waiting = Tier(GIB, 0.0)
    waiting.waiting_for_plan = True
    placer.attach_shards(waiting, True)
    assert not placer.optimizer_may_place(2)
    assert not placer.optimizer_may_place(3)  # a recorded trace still waits for its plan
    waiting.waiting_for_plan = False
    assert placer.optimizer_may_place(3)  # the fourth step at the latest
    placer.withdraw(opt)
    assert not placer.pending(opt) and not placer.window.waiting - {waiting}


def test_the_window_closes_only_while_a_tier_waits():
    window = StepWindow()
    window.step_ended()
    assert window.windows == 0
    tier = Tier(0, 0.0)
    window.wait_for_me(tier)
    window.step_ended()
    from zerostream.offload.memory_preflight import memory_status

    if "VmHWM" in memory_status():
        assert window.windows == 1 and window.last_excess is not None
    window.done(tier)
    before = window.windows
    window.step_ended()
    assert window.windows == before


def test_two_windows_keep_their_own_measurements():
    # Two engines in one process: each stage optimizer's window is its own.
    a, b = StepWindow(), StepWindow()
    tier = Tier(0, 0.0)
    a.wait_for_me(tier)
    assert tier in a.waiting and tier not in b.waiting
    a.last_excess = 5
    assert b.last_excess is None


def test_the_step_clock_measures_the_update_and_leaves_a_shards_move_out(monkeypatch):
    # Note [Predicting the placed step], with a hand-driven clock: forward and backward of
    # 10 s, an update of 4 s that moved 1000 bytes (600 of them shards written) and waited
    # 3 s; the shards then moved into host memory in 2 s, leaving a quarter on disk.
    from zerostream.offload.placement import predict
    from zerostream.offload.placement.placer import Move

    now = [100.0]
    monkeypatch.setattr(predict.time, "perf_counter", lambda: now[0])
    clock = predict.StepClock()
    clock.begin()
    clock.open(0, 0, 0.0)
    now[0] += 4.0
    clock.close(400, 600, 3.0)
    assert (clock.seconds, clock.disk_bytes, clock.shard_bytes, clock.wait) == (4.0, 1000, 600, 3.0)
    now[0] += 10.0
    clock.begin()
    assert clock.forward_backward_s == 10.0 and clock.last_interval == 14.0
    moved = Move(ended_at=now[0] - 1.0, seconds=2.0, disk_share_after=0.25)
    got = clock.predict(200, moved)
    # 8 s of forward and backward; the update scaled by (200 + 150) / 1000, floored at the
    # 1 s it did not wait.
    assert got["forward_backward_seconds"] == 8.0
    assert got["predicted_optimizer_step_seconds"] == 1.4
    assert clock.predict(200)["forward_backward_seconds"] == 10.0  # no move: as measured
    stale = Move(ended_at=now[0] - 20.0, seconds=2.0, disk_share_after=0.25)
    assert clock.predict(200, stale) == clock.predict(200)  # a move before the last update
