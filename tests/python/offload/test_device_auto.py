"""`zerostream.optimizer_max_on_device` (Note [The device tier from a measured step],
offload/placement/device.py): the optimizer sub-groups kept and stepped on the compute device, as
an element count (placed at build, like offload_optimizer.ratio) or "auto" (sized from the
device memory a measured step leaves).

- The arithmetic: which sub-groups an element count keeps, the budget, the choice (on-disk
  sub-groups first, whole ones, a misfit skipped), by hand.
- "auto" on the simulated device with a capacity (its memory model stands for the GPU's;
  holding more than it is a violation): a first run with room for everything measures what
  the run holds; a second run's capacity leaves room for two and a half sub-groups beyond
  that, so exactly two move, from NVMe, at the second step; their extents are freed and the
  disk moves only the rest from then on; the device never runs out; losses are plain
  PyTorch AdamW's; a checkpoint saved after the move resumes into an all-NVMe engine with
  the uninterrupted run's losses.
- Two ranks whose devices have different room place the same sub-groups (the smallest
  budget, agreed), at stage 3 and at stage 2.
- "auto" where the device's memory is the host's (the CPU run): nothing moves, and it says
  why. A device that cannot allocate the chosen tier: nothing moves, nothing is lost.
- The element count places the first whole sub-groups that fit, and trains as PyTorch.
- The config refuses it with a ratio and at stage 0, by name.
"""

import os

import pytest
import torch
from test_device_tier import _config as device_tier_config

from multirank import run_ranks
from tiny_gpt import TinyGPT, make_batches, plain_adamw_losses
from zerostream.offload.placement import DEVICE, NVME, budgets, plans
from zerostream.offload.placement import device as device_auto

STEPS, GLOBAL_BATCH, SUB_GROUP = 4, 8, 2000
LR, BETAS, WD, CLIP = 1e-2, (0.9, 0.95), 0.01, 0.5
STATE = 12  # fp32 master, exp_avg, exp_avg_sq
ROOM = int(2.5 * SUB_GROUP * STATE)  # device bytes for two sub-groups and a half


# --- the arithmetic ------------------------------------------------------------------------------
def test_an_element_count_keeps_the_first_whole_sub_groups_that_fit():
    assert plans.count_within([2000, 2000, 2000, 500], 4000) == 2
    assert plans.count_within([2000, 2000, 2000, 500], 3999) == 1
    assert plans.count_within([2000, 2000], 10**9) == 2
    # In step order: a small later sub-group does not jump a big one that does not fit.
    assert plans.count_within([2000, 3000, 500], 2600) == 1


def test_a_count_below_the_first_sub_group_places_nothing_and_says_so(caplog):
    from zerostream.offload.tiered_state import SubGroup

    groups = [SubGroup(0, 0, 2000, 0), SubGroup(0, 2000, 4000, 1)]
    kinds = [torch.float32] * 3
    with caplog.at_level("WARNING", logger="zerostream"):
        assert device_auto.build(groups, kinds, torch.device("cpu"), 1.0, 1999) is None
    assert "zerostream.optimizer_max_on_device 1999: the first optimizer sub-group" in caplog.text
    tier = device_auto.build(groups, kinds, torch.device("cpu"), 1.0, 2000)
    assert [s.index for s in tier.sub_groups] == [0] and groups[0].dev is not None


def test_the_budget_is_free_memory_less_the_step_s_excess_the_update_and_the_reserve():
    gib = 1 << 30
    reserve = budgets.DEVICE_RESERVE_BYTES + int(budgets.DEVICE_RESERVE_SHARE * 40 * gib)
    assert reserve == (256 << 20) + 2 * gib  # 5% of 40 GiB is 2 GiB
    assert budgets.device_budget_bytes(10 * gib, 3 * gib, 40 * gib, 1 << 20) == (
        10 * gib - 3 * gib - (1 << 20) - reserve
    )
    assert budgets.device_budget_bytes(gib, 3 * gib, 40 * gib, 0) == 0  # never negative
    # One bf16 gradient buffer of 1e8 elements and the Adam temporaries of one 2**24 chunk.
    assert budgets.device_update_bytes(10**8, 2) == 2 * 10**8 + 32 * (1 << 24)
    assert budgets.device_update_bytes(1000, 4) == 4000 + 32 * 1000


def test_on_disk_sub_groups_go_first_whole_and_a_misfit_is_skipped():
    # (elements, on disk) in step order; 12 bytes an element.
    cands = [(100, False), (300, True), (200, True), (100, True), (50, False)]
    # 5400 bytes = 450 elements: disk ones in order: 300 fits, 200 does not (500), 100 does
    # (400); then host ones: 100 does not (500), 50 does (450).
    assert plans.choose(cands, 450 * 12, 12) == [1, 3, 4]
    # 299 elements: 300 does not fit, 200 does, 100 not (300), host 100 not, 50 does (250).
    assert plans.choose(cands, 299 * 12, 12) == [2, 4]
    assert plans.choose(cands, 0, 12) == []
    assert plans.choose(cands, 10**9, 12) == [0, 1, 2, 3, 4]


# --- the engine ----------------------------------------------------------------------------------
def _config(micro, nvme, on_device="auto", device="nvme", ratio=1.0):
    return device_tier_config(micro, nvme, device=device, ratio=ratio, on_device=on_device)


def _train(engine, rank, world, steps, first=0):
    import torch.distributed as dist

    micro = GLOBAL_BATCH // world
    xs, ys = make_batches(first + steps, GLOBAL_BATCH)
    swapper = engine.optimizer.swapper
    losses, traffic, tiers = [], [], []
    for s in range(first, first + steps):
        before = (swapper.bytes_read, swapper.bytes_written)
        loss = engine(
            xs[s][rank * micro : (rank + 1) * micro], ys[s][rank * micro : (rank + 1) * micro]
        )
        engine.backward(loss)
        engine.step()
        traffic.append((swapper.bytes_read - before[0], swapper.bytes_written - before[1]))
        tiers.append([sg.tier for sg in swapper.sub_groups])
        total = loss.detach().float().clone()
        dist.all_reduce(total)
        losses.append(float(total) / world)
    return losses, traffic, tiers


def _engine(cfg):
    import zerostream

    torch.manual_seed(0)
    return zerostream.initialize(model=TinyGPT(), config=cfg)[0]


def _sized_at_the_move(swapper, sim, room: int) -> None:
    """Gives the simulated device, when "auto" measures it, a capacity of what the run holds
    then, the measured step's excess, the update's needs and `room` bytes, with no reserve:
    any device byte the measurement missed is then out of memory (a violation)."""
    import gc

    placement = swapper.device_auto
    place = placement.place

    def sized(offloaded, kind_dtypes, grad_itemsize, move):
        gc.collect()
        mem = sim.memory
        held, excess = mem.allocated_bytes(), mem.peak - mem.allocated_bytes()
        width = max(s.hi - s.lo for s in swapper.sub_groups)
        mem.capacity = held + excess + budgets.device_update_bytes(width, grad_itemsize) + room
        return place(offloaded, kind_dtypes, grad_itemsize, move)

    placement.place = sized


def auto_worker(rank, world, root):
    from zerostream.testing import sim_device

    micro = GLOBAL_BATCH // world
    out = {}
    # No reserve: the capacity is exactly what the step was measured to need, and the room.
    budgets.DEVICE_RESERVE_BYTES, budgets.DEVICE_RESERVE_SHARE = 0, 0.0
    with sim_device.installed("lazy", 0, rank, track_memory=True) as sim:
        engine = _engine(_config(micro, f"{root}/auto"))
        swapper = engine.optimizer.swapper
        _sized_at_the_move(swapper, sim, ROOM)
        extents_before = swapper.store.stats()
        losses, traffic, tiers = _train(engine, rank, world, STEPS - 1)
        out["sizes"] = [s.hi - s.lo for s in swapper.sub_groups]
        out["inputs"] = swapper.device_auto.inputs
        out["stats"] = swapper.stats()
        out["extents_before"] = extents_before
        out["dev_on_engine_device"] = all(
            sim.on_device(t) for s in swapper.sub_groups if s.dev for t in s.dev
        )
        engine.save_checkpoint(f"{root}/ckpt", tag="moved")
        more = _train(engine, rank, world, 1, first=STEPS - 1)
        out["auto"] = (losses + more[0], traffic + more[1], tiers + more[2])
        out["peak_over_capacity"] = sim.memory.peak - sim.memory.capacity
        engine.destroy()
        out["violations"] = list(sim.violations)
        sim.violations.clear()
    # The checkpoint resumes into an all-NVMe engine (no device tier).
    engine = _engine(_config(micro, f"{root}/resumed", on_device=0))
    engine.load_checkpoint(f"{root}/ckpt", tag="moved")
    out["resumed"] = _train(engine, rank, world, 1, first=STEPS - 1)[0]
    out["resumed_device"] = engine.optimizer.swapper.stats()["device_elements"]
    engine.destroy()
    return out


def test_auto_moves_what_the_device_memory_a_step_leaves_holds_and_trains_as_pytorch(tmp_path):
    reference = plain_adamw_losses(STEPS, GLOBAL_BATCH, LR, BETAS, WD, CLIP)
    for out in run_ranks(auto_worker, 2, str(tmp_path)):
        # The device never held more than the capacity sized from the measured step.
        assert out["violations"] == [] and out["peak_over_capacity"] <= 0, out
        sizes = out["sizes"]
        assert len(sizes) >= 4 and sizes[0] == sizes[1] == sizes[2] == SUB_GROUP, sizes
        inputs, stats = out["inputs"], out["stats"]
        # The budget (no reserve in the workers): what the device can still give, less the
        # measured interval's excess and the update's needs: the room the capacity left.
        free, excess = inputs["free_bytes"], inputs["step_excess_bytes"]
        assert inputs["budget_bytes"] == free - excess - inputs["update_bytes"] == ROOM
        assert excess > 0  # the forward and backward's gathered parameters, at least
        # ... and left two sub-groups and a half: the first two moved, from NVMe.
        losses, traffic, tiers = out["auto"]
        assert tiers[0] == [NVME] * len(sizes)  # nothing before a step was measured
        assert tiers[1][:2] == [DEVICE, DEVICE] and DEVICE not in tiers[1][2:], tiers[1]
        assert all(t == tiers[1] for t in tiers[2:])
        moved = sizes[0] + sizes[1]
        assert inputs["moved_elements"] == stats["device_elements"] == moved
        assert out["dev_on_engine_device"]
        # Their extents were freed: only the NVMe ones have any, and the disk moves only
        # them, 12 bytes an element each way, from the step after the move.
        for s in stats["sub_groups"]:
            assert ("param" in s) == (s["tier"] == NVME), s
        rest = sum(sizes) - moved
        assert traffic[0] == (STATE * sum(sizes),) * 2
        # The move's step read the two once more (into the device), then stepped the rest.
        assert traffic[1] == (STATE * sum(sizes), STATE * rest)
        assert traffic[2:] == [(STATE * rest,) * 2] * (STEPS - 2)
        before = out["extents_before"]["used_bytes"]
        # Six extents (three kinds of two sub-groups) of 8000 bytes, 4 KiB-aligned, freed.
        extent = -(-4 * SUB_GROUP // 4096) * 4096
        assert stats["store"]["tensors"] == out["extents_before"]["tensors"] - 6
        assert stats["store"]["used_bytes"] == before - 6 * extent, (before, stats["store"])
        assert losses == pytest.approx(reference, rel=1e-5)
        # Nothing lost: the all-NVMe engine resumes where the device tier left off.
        assert out["resumed_device"] == 0
        assert out["resumed"] == pytest.approx(losses[STEPS - 1 :], rel=1e-6)


def differ_worker(rank, world, root, stage):
    """Rank 1's device has room for three sub-groups more than rank 0's (another process on
    its GPU took less, a different card): each rank measures its own."""
    from zerostream.testing import sim_device

    micro = GLOBAL_BATCH // world
    budgets.DEVICE_RESERVE_BYTES, budgets.DEVICE_RESERVE_SHARE = 0, 0.0
    cfg = _config(micro, f"{root}/differ")
    cfg["zero_optimization"]["stage"] = stage
    with sim_device.installed("lazy", 0, rank, track_memory=True) as sim:
        engine = _engine(cfg)
        swapper = engine.optimizer.swapper
        _sized_at_the_move(swapper, sim, ROOM + rank * 3 * SUB_GROUP * STATE)
        run = _train(engine, rank, world, STEPS)
        out = {"run": run, "inputs": swapper.device_auto.inputs}
        engine.destroy()
        out["violations"] = list(sim.violations)
        sim.violations.clear()
    return out


@pytest.mark.parametrize("stage", [3, 2])
def test_ranks_whose_devices_have_different_room_place_the_same_sub_groups(tmp_path, stage):
    """Note [Every rank places the same tiers]: the ranks agree the smallest budget, so both
    move the two sub-groups rank 0's room holds (rank 1 alone would move five). A tier placed
    per rank steps different sub-groups where on each rank, and, on the ranks whose room was
    larger, sizes from a reading the other ranks did not have. At stage 2 (each rank's slice
    of the flat groups) as at stage 3."""
    reference = plain_adamw_losses(STEPS, GLOBAL_BATCH, LR, BETAS, WD, CLIP)
    outs = run_ranks(differ_worker, 2, str(tmp_path), stage)
    own = [o["inputs"]["free_bytes"] - o["inputs"]["step_excess_bytes"] for o in outs]
    assert own[1] - own[0] >= 2 * SUB_GROUP * STATE, own  # the readings really differ
    for out in outs:
        assert out["violations"] == [], out["violations"]
        losses, _, tiers = out["run"]
        assert out["inputs"]["budget_bytes"] == ROOM, out["inputs"]
        assert tiers[1][:2] == [DEVICE, DEVICE] and DEVICE not in tiers[1][2:], tiers[1]
        assert losses == pytest.approx(reference, rel=1e-5)
    assert outs[0]["run"][2] == outs[1]["run"][2]


def elsewhere_worker(rank, world, root):
    from zerostream.testing import sim_device

    micro = GLOBAL_BATCH // world
    out = {}
    # The CPU: the device's memory is the host's.
    engine = _engine(_config(micro, f"{root}/cpu"))
    out["cpu"] = _train(engine, rank, world, 3)
    out["cpu_inputs"] = engine.optimizer.swapper.device_auto.inputs
    engine.destroy()

    # A device that refuses the allocation after all.
    class Refusing(device_auto.DeviceTier):
        def __init__(self, sub_groups, *args, **kwargs):
            sub_groups[0].dev = [torch.empty(1)]  # a partial allocation, undone by the caller
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    saved = device_auto.DeviceTier
    device_auto.DeviceTier = Refusing
    try:
        with sim_device.installed("lazy", 0, rank, device_capacity=2 << 30):
            engine = _engine(_config(micro, f"{root}/refused"))
            out["refused"] = _train(engine, rank, world, 3)
            out["refused_inputs"] = engine.optimizer.swapper.device_auto.inputs
            engine.destroy()
    finally:
        device_auto.DeviceTier = saved
    # An element count: the first whole sub-groups within it, from the start, with "cpu".
    engine = _engine(_config(micro, None, on_device=2 * SUB_GROUP + 1, device="cpu"))
    out["count"] = _train(engine, rank, world, STEPS)
    out["count_store"] = engine.optimizer.swapper.store
    engine.destroy()
    return out


def test_auto_without_device_memory_or_room_moves_nothing_and_a_count_places_at_build(tmp_path):
    reference = plain_adamw_losses(STEPS, GLOBAL_BATCH, LR, BETAS, WD, CLIP)
    for out in run_ranks(elsewhere_worker, 2, str(tmp_path)):
        for run in ("cpu", "refused"):
            losses, traffic, tiers = out[run]
            assert all(set(t) == {NVME} for t in tiers), (run, tiers)
            assert traffic[1:] == traffic[:1] * 2  # every step all of it, to and from disk
            assert losses == pytest.approx(reference[:3], rel=1e-5)
        assert out["cpu_inputs"] == {"source": "the device's memory is the host's"}
        assert "out of memory" in out["refused_inputs"]["refused"]
        losses, traffic, tiers = out["count"]
        assert tiers[0][:2] == [DEVICE, DEVICE] and DEVICE not in tiers[0][2:], tiers[0]
        assert all(t == tiers[0] for t in tiers)
        assert out["count_store"] is None  # "cpu": no swap files
        assert losses == pytest.approx(reference, rel=1e-5)


@pytest.mark.parametrize(
    "zero,needle",
    [
        (
            {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.5}},
            'zerostream.optimizer_max_on_device: "auto" and '
            "zero_optimization.offload_optimizer.ratio 0.5 both size",
        ),
        (
            {"stage": 0, "offload_optimizer": {"device": "cpu"}},
            'zerostream.optimizer_max_on_device: "auto" keeps part of an offloaded '
            "optimizer's sub-groups on the device, under ZeRO stages 1-3; got stage 0",
        ),
    ],
)
def test_the_config_refuses_it_with_a_ratio_and_at_stage_0_by_name(zero, needle):
    from zerostream.config import ConfigError, load

    cfg = {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": zero,
        "zerostream": {"optimizer_max_on_device": "auto"},
    }
    with pytest.raises(ConfigError) as err:
        load(cfg, world_size=1)
    assert needle in str(err.value)


def test_without_an_offloaded_optimizer_it_is_said_to_have_no_effect():
    from zerostream.config import load

    cfg = {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 3},
        "zerostream": {"optimizer_max_on_device": 1000},
    }
    warnings = load(cfg, world_size=1, log=False).warnings
    assert any(
        w.startswith("zerostream.optimizer_max_on_device: 1000 has no effect") for w in warnings
    ), warnings


# --- on the device under test (scripts/gpu-check.sh runs the "device" tests) ---------------------
ON_GPU = torch.cuda.is_available() and os.environ.get("ZS_TEST_DEVICE", "") != "sim"


def device_worker(rank, world, root, kind):
    import contextlib

    from zerostream.testing import sim_device

    micro = GLOBAL_BATCH // world
    if kind == "cuda":
        torch.cuda.set_device(rank)
        device = contextlib.nullcontext(None)
    else:  # a GPU's worth of memory, copies completing at random
        device = sim_device.installed("random", 7, rank, device_capacity=8 << 30)
    with device as sim:
        engine = _engine(_config(micro, f"{root}/dev"))
        swapper = engine.optimizer.swapper
        losses, traffic, tiers = _train(engine, rank, world, 3)
        where = {t.device.type for s in swapper.sub_groups if s.dev for t in s.dev}
        out = {
            "run": (losses, traffic, tiers),
            "where": where,
            "engine_device": engine.device.type,
            "violations": list(sim.violations) if sim is not None else [],
        }
        if sim is not None:
            sim.violations.clear()
        engine.destroy()
    return out


@pytest.mark.device
def test_auto_on_the_device_under_test_moves_a_small_model_s_whole_state_there(tmp_path):
    """On a GPU (or the simulated one, 8 GiB): TinyGPT's state fits many times, so after the
    measured step every sub-group is on the device, the disk moves nothing more, and the
    losses are plain PyTorch's (fp32; on a GPU at test_device_engine's widened bounds)."""
    kind = "cuda" if ON_GPU else "sim"
    out = run_ranks(device_worker, 1, str(tmp_path), kind)[0]
    losses, traffic, tiers = out["run"]
    assert out["violations"] == []
    assert set(tiers[0]) == {NVME} and all(set(t) == {DEVICE} for t in tiers[1:]), tiers
    assert out["where"] == {out["engine_device"]}
    assert traffic[2] == (0, 0)  # nothing left on disk
    reference = plain_adamw_losses(3, GLOBAL_BATCH, LR, BETAS, WD, CLIP)
    assert losses == pytest.approx(reference, rel=2e-4 if kind == "cuda" else 1e-5)


def planned_worker(rank, world, root):
    from test_param_tiers import ExtraAtStepTwo

    import zerostream
    from zerostream.testing import sim_device

    micro = GLOBAL_BATCH // world
    with sim_device.installed("lazy", 0, rank, device_capacity=2 << 30):
        torch.manual_seed(0)
        model = ExtraAtStepTwo()
        engine = zerostream.initialize(model=model, config=_config(micro, f"{root}/p"))[0]
        _, _, tiers = _train(engine, rank, world, 5)
        trace = engine.optimizer.state_summary()["trace"]
        engine.destroy()
    return tiers, trace


def test_auto_sizes_the_device_tier_from_a_step_that_ran_the_plan(tmp_path):
    """Step 1 records the stage-3 trace; step 2 leaves it (a module it did not record) and
    gathers without the plan's prefetches, a smaller peak; step 3 records again; step 4 runs
    the plan. "auto" measures step 4 and places at its optimizer step: sized from step 2 it
    could run out of device memory once the plan's prefetches ran."""
    for tiers, trace in run_ranks(planned_worker, 2, str(tmp_path)):
        assert trace["invalidations"] == 1 and trace["trace_recordings"] == 2, trace
        placed = [DEVICE in t for t in tiers]
        assert placed == [False, False, False, True, True], tiers
