"""The GPU-path defects a review found (the GPU-proof issue), each shown on the simulated
device (zerostream/testing/sim_device.py) on 2 ranks, rank r on its own device r, and
compared with the same run on the plain CPU:

- a step() with no backward since the last one rewrites the host masters only after the
  last update's uploads from them completed (stage 2, fp32 device partitions);
- stage 2 with overlap_comm keeps at most two buckets in flight and lands the others during
  backward, not all after it;
- stage 3 with parameters on NVMe uploads and all-gathers a read ahead one module early
  (while the module before it runs), not when the module that needs it waits;
- stage 3 with parameters on the host and the optimizer on the device lands gradients
  through the copy stage's download lane (it was a blocking .to() on autograd's thread);
- zero.Init and initialize() make the rank's device current (a user-made process group
  left the object collectives of the trace check and checkpoints on device 0);
- the host arenas register their memory once, not per step, and pin_memory false
  registers nothing (its copies are then reported as pageable);
- NVMe staging smaller than the read-ahead waits for the uploads that hold it, and weights
  rewritten in GatheredParameters wait for the uploads reading the old shards;
- DataLoader workers forked after the host memory was registered change nothing;
- every step after the first stays within the host's budget (reads of device memory, lane
  waits, registrations: STEP_BUDGET).
"""

import gc

import pytest
import torch

from equal import same_tensors
from mlp import MLP
from multirank import run_ranks
from tiny_gpt import TinyGPT, make_batches

# Whichever test runs first runs every scenario (the module's fixture).
pytestmark = pytest.mark.timeout(900)


def _config(stage, **zero):
    return {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
        "zero_optimization": {"stage": stage, **zero},
    }


def _gpt_steps(engine, rank, steps, skip_backward_at=None, counted=None):
    """Losses of `steps` steps; `counted` (a StepCounters) takes the device's counters over
    each step, on the simulated device."""
    xs, ys = make_batches(steps, 8)
    losses = []
    for s in range(steps):
        if s == skip_backward_at:
            engine.step()  # a step with no backward since the last one
            continue
        loss = engine(xs[s][rank * 4 : rank * 4 + 4], ys[s][rank * 4 : rank * 4 + 4])
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
        if counted is not None:
            counted.step_done()
    return losses


def _counted_steps(engine, rank, steps):
    """(losses, the device's counters over each step: [] on the plain CPU)."""
    from zerostream.testing.step_budget import StepCounters

    counted = StepCounters()
    return _gpt_steps(engine, rank, steps, counted=counted), counted


def _blocking_downloads(counted) -> int:
    return sum(counts["blocking_downloads"] for counts in counted.steps)


def _weights(engine):
    from zerostream.zero import GatheredParameters

    with GatheredParameters(list(engine.module.parameters())):
        return [p.detach().clone() for p in engine.module.parameters()]


def scenario_step_without_backward(rank, tmp):
    import zerostream

    torch.manual_seed(0)
    cfg = _config(2, offload_optimizer={"device": "cpu"})
    engine, *_ = zerostream.initialize(model=TinyGPT(), config=cfg)
    losses = _gpt_steps(engine, rank, 4, skip_backward_at=1)
    return losses, _weights(engine)


def scenario_overlap_comm(rank, tmp):
    import zerostream
    from zerostream.zero.grad_reduce import Stage2Reducer

    torch.manual_seed(0)
    zero = {"overlap_comm": True, "reduce_bucket_size": 300, "offload_optimizer": {"device": "cpu"}}
    engine, opt, *_ = zerostream.initialize(model=TinyGPT(), config=_config(2, **zero))
    in_flight, before_end = [], []
    flush, after = Stage2Reducer.flush, opt.after_backward

    def counted_flush(self):
        flush(self)
        in_flight.append(len(self._pending))

    def counted_after():
        before_end.append(opt.copy_stage.stats["copies"])
        after()

    Stage2Reducer.flush, opt.after_backward = counted_flush, counted_after
    try:
        losses = _gpt_steps(engine, rank, 3)
    finally:
        Stage2Reducer.flush = flush
    buckets = opt.reducer.collectives
    return losses, _weights(engine), max(in_flight), min(before_end), dict(buckets)


def scenario_nvme_read_ahead(rank, tmp):
    import zerostream

    torch.manual_seed(0)
    zero = {
        "offload_param": {"device": "nvme", "nvme_path": f"{tmp}/p{rank}", "max_in_cpu": 0},
        "stage3_param_persistence_threshold": 0,
        "stage3_prefetch_bucket_size": 12000,  # several modules ahead
    }
    engine, opt, *_ = zerostream.initialize(model=TinyGPT(), config=_config(3, **zero))
    losses = _gpt_steps(engine, rank, 4)
    launches = opt.part.summary()["read_launches"]
    return losses, _weights(engine), launches


def scenario_nvme_small_staging(rank, tmp):
    import zerostream

    torch.manual_seed(0)
    zero = {
        "offload_param": {
            "device": "nvme",
            "nvme_path": f"{tmp}/p{rank}",
            "max_in_cpu": 0,
            "buffer_count": 1,
            "buffer_size": 512,  # raised to two of the largest shard, no more
        },
        "stage3_param_persistence_threshold": 0,
        "stage3_prefetch_bucket_size": 12000,
    }
    engine, opt, *_ = zerostream.initialize(model=TinyGPT(), config=_config(3, **zero))
    opt.part.swapper.auto_buffer_count = False  # keep the staging smaller than the read-ahead
    losses = _gpt_steps(engine, rank, 3)
    return losses, _weights(engine), opt.part.swapper.stats()


def scenario_modified_weights(rank, tmp):
    import zerostream
    from zerostream.zero import GatheredParameters

    torch.manual_seed(0)
    zero = {"offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}}
    engine, *_ = zerostream.initialize(model=TinyGPT(), config=_config(3, **zero))
    losses = _gpt_steps(engine, rank, 2)
    params = list(engine.module.parameters())
    with GatheredParameters(params, modifier_rank=0):  # rewrites every host shard after
        if rank == 0:
            with torch.no_grad():
                for p in params:
                    p.mul_(0.5)
    losses += _gpt_steps(engine, rank, 2)
    return losses, _weights(engine)


def scenario_set_fp32_params(rank, tmp):
    """safe_set_full_fp32_param right after a step: with bf16 masters in host memory the
    step's uploads read the masters themselves, and may still be in flight."""
    import zerostream
    from zerostream.utils import safe_get_full_fp32_param, safe_set_full_fp32_param

    torch.manual_seed(0)
    config = _config(2, offload_optimizer={"device": "cpu"})
    config["bf16"] = {"enabled": True, "bf16_master_weights_and_grads": True}
    engine, *_ = zerostream.initialize(model=TinyGPT(), config=config)
    losses = _gpt_steps(engine, rank, 2)
    for p in engine.module.parameters():
        safe_set_full_fp32_param(p, safe_get_full_fp32_param(p) * 0.5)
    losses += _gpt_steps(engine, rank, 2)
    return losses, _weights(engine)


def scenario_host_params_device_optimizer(rank, tmp):
    import zerostream

    torch.manual_seed(0)
    zero = {"offload_param": {"device": "cpu"}, "stage3_param_persistence_threshold": 0}
    engine, opt, *_ = zerostream.initialize(model=TinyGPT(), config=_config(3, **zero))
    losses, per_step = _counted_steps(engine, rank, 3)
    landed = opt.copy_stage.stats["d2h_bytes"] if opt.copy_stage is not None else 0
    return losses, _weights(engine), landed, per_step


def scenario_device_tier_host_params(rank, tmp):
    """offload_optimizer.ratio keeps half the sub-groups on the device while the params'
    shards live in host memory (offload_param cpu): each device sub-group's updated slice
    goes down on the lane while the CPU steps the others, no blocking copy."""
    import zerostream

    torch.manual_seed(0)
    zero = {
        "offload_param": {"device": "cpu"},
        "offload_optimizer": {"device": "cpu", "ratio": 0.5},
        "stage3_param_persistence_threshold": 0,
        "sub_group_size": 2000,
    }
    engine, opt, *_ = zerostream.initialize(model=TinyGPT(), config=_config(3, **zero))
    losses, per_step = _counted_steps(engine, rank, 3)
    on_device = opt.swapper.stats()["device_elements"]
    return losses, _weights(engine), on_device, per_step


def scenario_zero_init_device(rank, tmp):
    import zerostream
    from zerostream.accelerator import get_accelerator

    cfg = _config(3, stage3_param_persistence_threshold=0)
    torch.manual_seed(0)
    with zerostream.zero.Init(config_dict_or_path=cfg):
        model = TinyGPT()
    bound_by_init = get_accelerator().current_device()
    engine, *_ = zerostream.initialize(model=model, config=cfg)
    losses = _gpt_steps(engine, rank, 3)  # step 2 checks the trace: an object collective
    engine.save_checkpoint(f"{tmp}/ckpt")
    engine.load_checkpoint(f"{tmp}/ckpt")
    return losses, _weights(engine), bound_by_init


def scenario_registrations(rank, tmp):
    import zerostream
    from zerostream.offload.host_buffers import arena_totals

    out = {}
    # Unpinned first: the previous engine's arenas die during the next run's setup (a
    # native reference holds a destroyed engine until then), and unpinned ones hold no
    # registrations to take away from its count.
    for pin in (False, True):
        torch.manual_seed(0)
        zero = {
            "offload_param": {
                "device": "nvme",
                "nvme_path": f"{tmp}/r{rank}{pin}",
                "max_in_cpu": 0,
                "pin_memory": pin,
            },
            "offload_optimizer": {"device": "cpu", "pin_memory": pin},
            "stage3_param_persistence_threshold": 0,
        }

        def registrations():  # a pooled arena's miss (fragmentation) registers on its own
            # Over live arenas: earlier engines' arenas must be gone, not die mid-count.
            gc.collect()
            totals = arena_totals()
            return totals["registrations"] - totals["pool_misses"]

        before = registrations()
        engine, *_ = zerostream.initialize(model=TinyGPT(), config=_config(3, **zero))
        _gpt_steps(engine, rank, 1)
        after_one = registrations()
        _gpt_steps(engine, rank, 3)
        out[pin] = (after_one - before, registrations() - after_one)
        engine.destroy()
        del engine  # its arenas go before the next run counts
    return out


# Offload kinds whose steps are held to budgets: (stage, zero_optimization)
BUDGETED = {
    "stage2_cpu": (2, {"offload_optimizer": {"device": "cpu"}}),
    "stage3_cpu": (
        3,
        {
            "offload_optimizer": {"device": "cpu"},
            "offload_param": {"device": "cpu"},
            "stage3_param_persistence_threshold": 0,
        },
    ),
    "stage3_nvme": (
        3,
        {
            "offload_optimizer": {"device": "nvme"},
            "offload_param": {"device": "nvme"},
            "stage3_param_persistence_threshold": 0,
        },
    ),
}


def _with_path(section, path):
    return dict(section, nvme_path=path) if isinstance(section, dict) else section


def scenario_step_budgets(rank, tmp):
    """The device's counters over each of 4 steps of every BUDGETED kind."""
    import zerostream

    losses, weights, per_step = [], [], {}
    for name, (stage, zero) in BUDGETED.items():
        zero = {k: _with_path(v, f"{tmp}/{name}{k}") for k, v in zero.items()}
        torch.manual_seed(0)
        engine, *_ = zerostream.initialize(model=TinyGPT(), config=_config(stage, **zero))
        run_losses, per_step[name] = _counted_steps(engine, rank, 4)
        losses += run_losses
        weights += _weights(engine)
        engine.destroy()
    return losses, weights, per_step


SCENARIOS = {
    "step_without_backward": scenario_step_without_backward,
    "overlap_comm": scenario_overlap_comm,
    "nvme_read_ahead": scenario_nvme_read_ahead,
    "nvme_small_staging": scenario_nvme_small_staging,
    "modified_weights": scenario_modified_weights,
    "set_fp32_params": scenario_set_fp32_params,
    "host_params_device_optimizer": scenario_host_params_device_optimizer,
    "device_tier_host_params": scenario_device_tier_host_params,
    "zero_init_device": scenario_zero_init_device,
    "registrations": scenario_registrations,
    "step_budgets": scenario_step_budgets,
}


def worker(rank, world, names, tmp):
    from zerostream.testing import sim_device

    out = {}
    for name in names:
        fn = SCENARIOS[name]
        cpu = fn(rank, f"{tmp}/{name}cpu")
        with sim_device.installed(policy="lazy", device_index=rank) as sim:
            try:
                simmed = fn(rank, f"{tmp}/{name}sim")
            finally:
                seen = (dict(sim.counters), list(sim.violations))
            sim.violations.clear()  # reported below, with the scenario's name
        out[name] = (cpu, simmed, seen)
    return out


def _same(cpu, simmed) -> bool:
    return cpu[0] == simmed[0] and same_tensors(cpu[1], simmed[1])


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu-path")
    env = {"DEEPSPEED_TIMEOUT": "2"}  # a rank that fails leaves the other in a collective
    return run_ranks(worker, 2, list(SCENARIOS), str(tmp), timeout=600, env=env)


def _check(results, name):
    for rank, out in enumerate(results):
        cpu, simmed, (counters, violations) = out[name]
        assert violations == [], f"rank {rank}: the device saw {violations}"
        if name != "registrations":
            assert _same(cpu, simmed), f"rank {rank}: not bit-equal to the CPU run"
        yield rank, cpu, simmed, counters


@pytest.mark.multirank
def test_a_step_without_backward_waits_for_the_last_uploads(results):
    for _, cpu, _, counters in _check(results, "step_without_backward"):
        assert len(cpu[0]) == 3 and counters["copies"] > 0


@pytest.mark.multirank
def test_overlap_comm_keeps_two_buckets_in_flight_and_lands_the_rest_in_backward(results):
    for _, _, simmed, _ in _check(results, "overlap_comm"):
        _, _, peak, copies_before_backward_ended, buckets = simmed
        assert buckets.get("all_reduce", 0) >= 3, buckets  # asynchronous ones, several
        assert peak <= 2, f"{peak} buckets in flight"
        assert copies_before_backward_ended > 0, "nothing landed before backward ended"


@pytest.mark.multirank
def test_nvme_reads_ahead_are_uploaded_and_gathered_one_module_early(results):
    for _, _, simmed, _ in _check(results, "nvme_read_ahead"):
        launches = simmed[2]
        # The first prefetch of a pass is needed by the very next module (launched at its
        # wait); the later ones reach further ahead and go out one module early.
        assert launches["early"] > launches["at_wait"] > 0, launches


@pytest.mark.multirank
def test_nvme_staging_smaller_than_the_read_ahead_waits_for_held_uploads(results):
    for _, _, simmed, counters in _check(results, "nvme_small_staging"):
        stats = simmed[2]
        assert stats["deferred_reads"] > 0, stats  # the read-ahead outgrew the staging
        assert counters["host_syncs"] > 0


@pytest.mark.multirank
def test_weights_modified_in_gathered_parameters_wait_for_the_uploads(results):
    for _, cpu, _, counters in _check(results, "modified_weights"):
        assert len(cpu[0]) == 4 and counters["copies"] > 0


@pytest.mark.multirank
def test_fp32_weights_set_after_a_step_wait_for_its_uploads(results):
    for _, cpu, _, counters in _check(results, "set_fp32_params"):
        assert len(cpu[0]) == 4 and counters["copies"] > 0


@pytest.mark.multirank
def test_host_params_with_a_device_optimizer_land_gradients_on_the_lane(results):
    for _, _, simmed, counters in _check(results, "host_params_device_optimizer"):
        _, _, d2h_bytes, per_step = simmed
        assert d2h_bytes > 0 and _blocking_downloads(per_step) == 0, per_step
        assert counters["copies"] > 0


@pytest.mark.multirank
def test_device_tier_slices_go_down_to_host_params_on_the_lane(results):
    for _, _, simmed, counters in _check(results, "device_tier_host_params"):
        _, _, on_device, per_step = simmed
        assert on_device > 0 and _blocking_downloads(per_step) == 0, (on_device, per_step)
        assert counters["copies"] > 0


# What a step after the first may cost the host, on the device's counters
# (zerostream/testing/step_budget.py). Host reads of device memory, each a wait for the
# compute stream on a GPU: the test's own loss read and the squared norm that decides
# clipping and overflow (base._host_scalar). The ranks' agreements (the late-part flags at
# the end of backward, stage 3's rounds) go over the group's host twin and read no device
# memory (Note [Agreements on the host] in comm/host_agreement.py): before, they added one
# read a step at stage 2 and two at stage 3 (17 in the first step, which records the trace).
# Host waits for a lane: the step's uploads and the gradients' landing. Nothing registered,
# downloaded with a blocking copy, copied from pageable memory or waited for by spinning.
STEP_BUDGET = {
    "registrations": 0,
    "blocking_downloads": 0,
    "pageable_copies": 0,
    "spin_waits": 0,
    "host_syncs": 2,
}
HOST_READS = {2: 2, 3: 2}


@pytest.mark.multirank
def test_steps_after_the_first_stay_within_the_hosts_budget(results):
    for rank, _, simmed, _ in _check(results, "step_budgets"):
        for name, counted in simmed[2].items():
            stage = BUDGETED[name][0]
            assert len(counted.steps) == 4, (rank, name)
            assert counted.over(**STEP_BUDGET, host_reads=HOST_READS[stage]) == [], (rank, name)
            first = counted.steps[0]
            assert first["host_reads"] > 0 and first["copies"] > 0, (rank, name, first)
        nvme_first = simmed[2]["stage3_nvme"].steps[0]
        assert nvme_first["registrations"] > 0, "the step's arena, registered once"


@pytest.mark.multirank
def test_zero_init_and_initialize_make_the_ranks_device_current(results):
    for rank, _, simmed, _ in _check(results, "zero_init_device"):
        assert simmed[2] == rank


@pytest.mark.multirank
def test_host_memory_is_registered_once_and_not_at_all_without_pin_memory(results):
    for _, _, simmed, counters in _check(results, "registrations"):
        (pinned_setup, pinned_later), (unpinned_setup, unpinned_later) = simmed[True], simmed[False]
        assert pinned_setup > 0 and pinned_later == 0, simmed
        assert unpinned_setup == 0 and unpinned_later == 0, simmed
        assert counters["pageable_copies"] > 0  # the pin_memory false run's, reported


def _dataloader_run(rank, world, workers):
    import zerostream

    torch.manual_seed(0)
    cfg = _config(2, offload_optimizer={"device": "cpu"})
    engine, *_ = zerostream.initialize(model=MLP(), config=cfg)
    data = torch.utils.data.TensorDataset(
        torch.randn(64, 8, generator=torch.Generator().manual_seed(5))
    )
    loader = torch.utils.data.DataLoader(
        data, batch_size=4, num_workers=workers, multiprocessing_context="fork" if workers else None
    )
    losses = []
    for (x,) in loader:
        loss = engine(x)
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    return losses, [p.detach().clone() for p in engine.module.parameters()]


def _dataloader_check() -> None:
    """In a process of its own (DataLoader workers cannot be forked from a daemonic rank)."""
    from zerostream import comm

    comm.init_distributed()
    plain, forked = _dataloader_run(0, 1, 0), _dataloader_run(0, 1, 2)
    same = plain[0] == forked[0] and same_tensors(plain[1], forked[1])
    print("BIT-EQUAL" if same else f"DIFFERENT {plain[0]} {forked[0]}")


def test_forked_dataloader_workers_change_nothing_with_offload():
    import os
    import pathlib
    import subprocess
    import sys

    here = pathlib.Path(__file__).resolve().parent
    code = f"import sys; sys.path[:0] = [{str(here)!r}, {str(here.parent)!r}]; "
    code += "import test_gpu_path; test_gpu_path._dataloader_check()"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "BIT-EQUAL", done.stdout[-2000:]
