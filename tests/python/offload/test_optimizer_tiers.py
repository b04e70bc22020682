"""Optimizer state in two tiers under offload_optimizer nvme (Note [Optimizer tiers],
offload/placement/): `zerostream.optimizer_max_in_cpu` keeps whole sub-groups in host memory.

- The placement, from budgets alone (no disk): the sub-groups and bytes computed by hand.
- The mechanism: host sub-groups have no extent in the swap files and the disk traffic of a
  step is 24 bytes per NVMe element only; the file sizes on disk say the same.
- The math: a tiered run is bitwise the all-on-NVMe run (Adam is elementwise) and both match
  plain PyTorch AdamW; a checkpoint saved tiered resumes exactly all on NVMe, and back.
"""

import pytest
import torch

from multirank import run_ranks
from tiny_gpt import TinyGPT, adamw_ds_config, make_batches, plain_adamw_losses
from zerostream.offload.placement import HOST, NVME, budgets, plans

STEPS, GLOBAL_BATCH, SUB_GROUP = 4, 8, 2000
LR, BETAS, WD, CLIP = 1e-2, (0.9, 0.95), 0.01, 0.5


# --- placement -----------------------------------------------------------------------------------
def test_host_sub_groups_are_spread_over_the_step_order_within_the_budget():
    plan = plans.place([10] * 10, 30)
    # Worked by hand: a sub-group goes to the host when the host tier is at least half a
    # sub-group behind its 30% share of the elements seen so far.
    assert [i for i, t in enumerate(plan.tiers) if t == HOST] == [1, 4, 8]
    assert (plan.host_elements, plan.nvme_elements) == (30, 70)
    assert plan.host_bytes == 360 and plan.disk_bytes_per_step == 2 * 12 * 70


def test_the_last_pass_fills_the_budget_with_whole_sub_groups_only():
    assert plans.place([10, 10, 5], 15).tiers == [HOST, NVME, HOST]
    assert plans.place([10, 10, 5], 9).tiers == [NVME, NVME, HOST]  # 10 would not fit
    assert plans.place([10, 10, 5], 4).tiers == [NVME] * 3
    assert plans.place([10, 10, 5], 10**9).tiers == [HOST] * 3
    assert plans.place([10, 10, 5], 0).tiers == [NVME] * 3


def test_auto_leaves_the_reserve_and_what_else_is_taken_and_shares_the_host():
    gib = 1 << 30
    # 20 GiB usable, 2 ranks here: 10 GiB each, less 1 GiB, less 5% (0.5 GiB), less 1 GiB
    # taken by something else (a step's measured excess): 7.5 GiB.
    assert budgets.auto_budget_bytes(20 * gib, 2, gib) == 7 * gib + gib // 2
    assert budgets.auto_budget_bytes(2 * gib, 1, gib) == 0  # nothing left after the reserve
    assert budgets.auto_budget_bytes(None, 1, 0) == 0  # no reading: all on NVMe


def test_auto_starts_on_disk_and_is_placed_from_the_measured_step(monkeypatch):
    monkeypatch.setenv("ZEROSTREAM_HOST_MEMORY_LIMIT", "4G")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    excess = 1 << 29  # a step's measured excess (StepWindow.excess)
    before = plans.plan([10**8] * 4, "auto")
    assert before.tiers == [NVME] * 4 and "after the first step" in before.source
    budget, source = budgets.measured_budget_bytes(excess)
    plan = plans.place([10**8] * 4, budget // 12, source)
    limit = 4 * 2**30
    assert plan.budget_elements == (limit - 2**30 - int(0.05 * limit) - 2**29) // 12
    assert plan.host_elements == 2 * 10**8  # two of the four fit in ~0.18e9 elements
    assert plan.tiers == [HOST, NVME, HOST, NVME]  # spread over the step order
    assert "ZEROSTREAM_HOST_MEMORY_LIMIT" in plan.source and "0.50 GiB a step" in plan.source
    taken, _ = budgets.measured_budget_bytes(excess, other_bytes=2**30)  # e.g. parameter shards
    assert budget - taken == 2**30
    # While host_malloc "retain" holds, the heap it keeps (about a step's excess) is left
    # out of the budget too (Note [Fresh pages cost more than the math]).
    kept, kept_source = budgets.measured_budget_bytes(excess, heap_retained=True)
    assert budget - kept == 1 << 29 and 'the heap "retain" keeps' in kept_source
    # A caller's own reading of the usable memory is used as given (not read again).
    given, source = budgets.measured_budget_bytes(excess, reading=(8 * 2**30, "a reading"))
    assert given == 8 * 2**30 - 2**30 - int(0.05 * 8 * 2**30) - 2**29
    assert source.startswith('"auto": a reading 8.00 GiB')


def test_a_step_s_excess_is_measured_from_the_process_s_peak():
    from zerostream.offload.memory_preflight import memory_status
    from zerostream.offload.placement import StepWindow

    if "VmHWM" not in memory_status():
        pytest.skip("/proc/self/status has no VmHWM here")
    window = StepWindow()
    big = torch.ones(64 << 20, dtype=torch.float32)  # 256 MiB, every page touched
    assert window.excess() >= 0
    del big  # a large allocation goes back to the kernel at once
    assert window.excess() >= 200 << 20


def test_a_placement_does_not_hide_the_excess_of_the_last_step():
    # A step's 256 MiB transient, then a placement that raises the RSS above that peak for
    # good: VmHWM - VmRSS alone reads about 0 after it (the 3.17 B run's shards were sized
    # from 0.25 GiB where a step needed 2); the window the step closed still says 256 MiB.
    from zerostream.offload.memory_preflight import memory_status, restart_peak
    from zerostream.offload.placement import StepWindow, window

    if "VmHWM" not in memory_status() or not restart_peak():
        pytest.skip("no VmHWM, or clear_refs refused, here")

    class Tier:
        pass

    peaks, tier = StepWindow(), Tier()
    peaks.step_ended()  # nothing waits: no window closes, the peak is left alone
    assert peaks.windows == 0 and peaks.last_excess is None
    peaks.wait_for_me(tier)
    big = torch.ones(64 << 20, dtype=torch.float32)
    del big
    peaks.step_ended()
    assert peaks.windows == 1 and peaks.last_excess >= 200 << 20
    step_peak = window.process_peak_bytes()
    kept = torch.ones(128 << 20, dtype=torch.float32)  # 512 MiB placed, every page touched
    status = memory_status()
    assert status["VmHWM"] - status["VmRSS"] < 64 << 20
    assert peaks.excess() >= 200 << 20
    assert window.process_peak_bytes() >= step_peak  # the benchmarks' peak survives restarts
    peaks.done(tier)
    peaks.step_ended()
    assert peaks.windows == 1
    del kept


# --- the engine ----------------------------------------------------------------------------------
def _config(micro, stage, nvme, max_in_cpu):
    zero = {
        "stage": stage,
        "reduce_bucket_size": 3000,
        "sub_group_size": SUB_GROUP,
        "offload_optimizer": {
            "device": "nvme",
            "nvme_path": nvme,
            "pipeline_read": True,
            "pipeline_write": True,
        },
    }
    return adamw_ds_config(
        micro, zero, LR, BETAS, WD, CLIP, zerostream={"optimizer_max_in_cpu": max_in_cpu}
    )


def _train(engine, rank, world, steps, first=0):
    import torch.distributed as dist

    micro = GLOBAL_BATCH // world
    xs, ys = make_batches(first + steps, GLOBAL_BATCH)
    losses, traffic = [], []
    swapper = engine.optimizer.swapper
    for s in range(first, first + steps):
        before = (swapper.bytes_read, swapper.bytes_written)
        loss = engine(
            xs[s][rank * micro : (rank + 1) * micro], ys[s][rank * micro : (rank + 1) * micro]
        )
        engine.backward(loss)
        engine.step()
        traffic.append((swapper.bytes_read - before[0], swapper.bytes_written - before[1]))
        total = loss.detach().float().clone()
        dist.all_reduce(total)
        losses.append(float(total) / world)
    return losses, traffic


def _params(engine):
    from zerostream.zero import GatheredParameters

    with GatheredParameters(list(engine.module.parameters())):
        return {n: p.detach().float().clone() for n, p in engine.module.named_parameters()}


def tiers_worker(rank, world, stage, root):
    import zerostream

    out = {}
    micro = GLOBAL_BATCH // world
    for name, max_in_cpu in (("nvme", 0), ("tiered", 5000)):
        torch.manual_seed(0)
        engine, *_ = zerostream.initialize(
            model=TinyGPT(), config=_config(micro, stage, f"{root}/{name}", max_in_cpu)
        )
        losses, traffic = _train(engine, rank, world, STEPS)
        swapper = engine.optimizer.swapper
        stats = swapper.stats()
        # Each NVMe sub-group's fp32 master read straight from the swap file at the extent
        # the store reports, against the optimizer's own view of those elements.
        on_disk = []
        for s in stats["sub_groups"]:
            if s["tier"] == NVME:
                path, offset, nbytes = s["param"]
                with open(path, "rb") as f:
                    f.seek(offset)
                    raw = torch.frombuffer(bytearray(f.read(nbytes)), dtype=torch.float32)
                on_disk.append(
                    torch.equal(
                        raw[: s["end"] - s["begin"]],  # an extent is rounded up to 4 KiB
                        swapper.state_access.read_range(s["group"], s["begin"], s["end"]),
                    )
                )
        out[name] = {
            "on_disk_matches": on_disk,
            "extent_bytes": sum(
                s[k][2]
                for s in stats["sub_groups"]
                if s["tier"] == NVME
                for k in ("param", "exp_avg", "exp_avg_sq")
            ),
            "losses": losses,
            "traffic": traffic,
            "sub_groups": [{k: v for k, v in s.items()} for s in stats["sub_groups"]],
            "host": stats["host_elements"],
            "nvme": stats["nvme_elements"],
            "params": _params(engine),
        }
        engine.destroy()
    return out


@pytest.mark.parametrize("stage", [2, 3])
def test_a_tiered_run_is_bitwise_the_all_nvme_run_and_moves_only_its_nvme_state(tmp_path, stage):
    ranks = run_ranks(tiers_worker, 2, stage, str(tmp_path))
    reference = plain_adamw_losses(STEPS, GLOBAL_BATCH, LR, BETAS, WD, CLIP)
    for out in ranks:
        nvme, tiered = out["nvme"], out["tiered"]
        # Both tiers in use on this rank, whole sub-groups, within the 5000-element budget.
        kinds = [s["tier"] for s in tiered["sub_groups"]]
        assert HOST in kinds and NVME in kinds, kinds
        host = sum(s["end"] - s["begin"] for s in tiered["sub_groups"] if s["tier"] == HOST)
        assert host == tiered["host"] <= 5000
        assert all(s["tier"] == NVME for s in nvme["sub_groups"]) and nvme["host"] == 0
        # Host sub-groups have no extent in the swap files; NVMe ones have all three.
        for s in tiered["sub_groups"]:
            assert ("param" in s) == (s["tier"] == NVME), s
        # A step reads and writes 12 bytes per NVMe element, none for host ones; the swap
        # files hold the NVMe state only, and what they hold is the optimizer's state.
        for run in (tiered, nvme):
            assert run["traffic"] == [(12 * run["nvme"], 12 * run["nvme"])] * STEPS
            extents = 3 * sum(s["tier"] == NVME for s in run["sub_groups"])
            assert 12 * run["nvme"] <= run["extent_bytes"] < 12 * run["nvme"] + 4096 * extents
            assert run["on_disk_matches"] and all(run["on_disk_matches"])
        assert tiered["host"] + tiered["nvme"] == nvme["nvme"]
        # The math: the same bits as all on NVMe, and plain PyTorch's losses.
        assert tiered["losses"] == nvme["losses"]
        for n, p in nvme["params"].items():
            assert torch.equal(tiered["params"][n], p), n
        assert tiered["losses"] == pytest.approx(reference, rel=1e-5)


def resume_worker(rank, world, root):
    import zerostream

    micro = GLOBAL_BATCH // world
    out = {}

    def engine_for(name, max_in_cpu):
        torch.manual_seed(0)
        return zerostream.initialize(
            model=TinyGPT(), config=_config(micro, 3, f"{root}/{name}", max_in_cpu)
        )[0]

    # Uninterrupted, tiered: the reference for both resumes.
    engine = engine_for("whole", 5000)
    out["whole"], _ = _train(engine, rank, world, STEPS)
    engine.destroy()
    for saved_as, loaded_as in ((5000, 0), (0, 5000)):
        engine = engine_for(f"save{saved_as}", saved_as)
        _train(engine, rank, world, 2)
        engine.save_checkpoint(f"{root}/ckpt{saved_as}", tag="half")
        engine.destroy()
        engine = engine_for(f"load{loaded_as}", loaded_as)
        engine.load_checkpoint(f"{root}/ckpt{saved_as}", tag="half")
        out[(saved_as, loaded_as)], _ = _train(engine, rank, world, STEPS - 2, first=2)
        out[("host", loaded_as)] = engine.optimizer.swapper.stats()["host_elements"]
        engine.destroy()
    return out


def test_a_tiered_checkpoint_resumes_exactly_all_on_nvme_and_back(tmp_path):
    for out in run_ranks(resume_worker, 2, str(tmp_path)):
        assert out[("host", 0)] == 0 and out[("host", 5000)] > 0
        assert out[(5000, 0)] == out["whole"][2:]  # tiered -> all on NVMe
        assert out[(0, 5000)] == out["whole"][2:]  # all on NVMe -> tiered


def auto_worker(rank, world, root):
    import zerostream
    from zerostream.offload.placement import StepWindow

    # A step's measured excess, fixed: the rank's VmHWM carries its launcher's size.
    StepWindow.excess = lambda self: 1 << 28
    out = {}
    for max_in_cpu in (0, "auto"):
        torch.manual_seed(0)
        config = _config(GLOBAL_BATCH, 2, f"{root}/{max_in_cpu}", max_in_cpu)
        engine = zerostream.initialize(model=TinyGPT(), config=config)[0]
        swapper = engine.optimizer.swapper
        host_after_init = swapper.stats()["host_elements"]
        losses, traffic = _train(engine, rank, world, 3)
        stats = swapper.stats()
        out[max_in_cpu] = {
            "host_after_init": host_after_init,
            "host": stats["host_elements"],
            "nvme": stats["nvme_elements"],
            "budget": stats["budget_elements"],
            "sizes": [s["end"] - s["begin"] for s in stats["sub_groups"]],
            "freed": [
                3 * s.index + k not in swapper.store
                for s in swapper.sub_groups
                if s.on_host
                for k in range(3)
            ],
            "traffic": traffic,
            "losses": losses,
        }
        engine.destroy()
    return out


def test_auto_moves_what_fits_into_host_memory_after_the_first_step(tmp_path, monkeypatch):
    # The limit leaves room for about 5000 elements after the reserve (1 GiB and 5%) and
    # the measured excess (256 MiB).
    limit = 1_412_881_348
    monkeypatch.setenv("ZEROSTREAM_HOST_MEMORY_LIMIT", str(limit))
    out = run_ranks(auto_worker, 1, str(tmp_path))[0]
    none, auto = out[0], out["auto"]
    budget = (limit - 2**30 - int(0.05 * limit) - 2**28) // 12
    assert 4000 <= budget < 6000
    assert auto["host_after_init"] == 0  # "auto" starts all on disk
    assert auto["budget"] == budget
    host = auto["host"]
    assert 0 < host <= budget and host == plans.place(auto["sizes"], budget).host_elements
    assert auto["freed"] and all(auto["freed"])  # their extents left the swap files
    total = host + auto["nvme"]
    # Step 1 streams everything; step 2 reads the moving sub-groups once more, then streams
    # only what stayed on disk; step 3 likewise.
    assert auto["traffic"] == [
        (12 * total, 12 * total),
        (12 * host + 12 * auto["nvme"], 12 * auto["nvme"]),
        (12 * auto["nvme"], 12 * auto["nvme"]),
    ]
    assert none["host"] == 0 and none["traffic"] == [(12 * total, 12 * total)] * 3
    assert auto["losses"] == none["losses"]  # Adam is elementwise: the same bits
