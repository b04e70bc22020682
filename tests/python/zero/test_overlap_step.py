"""zerostream.overlap_step "next_forward" (Note [The step overlapped with the next forward] in
zero/overlap.py): ZeRO-3 with offload_optimizer cpu runs the update on a thread of its own
while the next forward gathers the shards it has updated.

Exactness: on 2 ranks, the overlapped run is the serial run bit for bit (losses, pre-clip
norms, final weights, the optimizer's fp32 state), with clipping that triggers, an lr
scheduler that changes the lr at every step while the update runs, persistent params and
gradient accumulation. Mechanism: the update was really behind the forward (gathers ran
before its last piece), and every gather ran after the pieces that write its shards;
deleting the gather's wait fails here (scripts/sync-mutations.py). Every reader of the state
waits (a checkpoint or an accessor right after step()), and a failing update is raised by
the next wait, naming it, with the run left inconsistent.
"""

import pytest
import torch

from full_state import full_state
from multirank import run_ranks
from overlap_trace import gathers_beside, pieces_of, step_config, third_loss, train_steps, watch
from tiny_gpt import TinyGPT, make_batches

STEPS = 4
GLOBAL_BATCH = 8


def config(micro: int, gas: int, dtype: str, params: str, persist: int, overlap: bool) -> dict:
    zero = {
        "stage": 3,
        "offload_optimizer": {"device": "cpu"},
        "stage3_param_persistence_threshold": persist,
        "reduce_bucket_size": 3000,
        "stage3_prefetch_bucket_size": 3000,
    }
    if params != "none":
        zero["offload_param"] = {"device": params}
    cfg = step_config(micro, gas, dtype, zero)
    if overlap:
        mode = overlap if isinstance(overlap, str) else "next_forward"
        cfg["zerostream"] = {"overlap_step": mode}
    return cfg


def _weights_and_state(engine) -> dict:
    return full_state(engine)


def train(rank, world, case, overlap):

    import zerostream

    dtype, params, persist, gas = case
    micro = GLOBAL_BATCH // (world * gas)
    xs, ys = make_batches(STEPS, GLOBAL_BATCH)
    torch.manual_seed(0)
    cfg = config(micro, gas, dtype, params, persist, overlap)
    engine = zerostream.initialize(model=TinyGPT(), config=cfg)[0]
    losses, norms, lrs = train_steps(engine, xs, ys, rank, world, gas)
    behind = engine.optimizer.behind
    launched = behind.launched if behind is not None else 0
    launched = (launched, engine.skipped_steps)
    seconds = dict(engine.telemetry.seconds)
    state = _weights_and_state(engine)
    engine.destroy()
    return losses, norms, lrs, state, launched, seconds


CASES = [
    ("bf16", "none", 0, 1),  # shards on the device, uploaded through the copy stage
    ("bf16", "cpu", 100, 1),  # shards in host memory, persistent params first
    ("fp32", "none", 100, 2),  # gradient accumulation: one update per two micro-steps
    ("fp16", "none", 100, 1),  # overflowed steps are skipped, the others overlapped
]


def worker(rank, world):
    return {
        case: (train(rank, world, case, False), train(rank, world, case, True)) for case in CASES
    }


def test_the_overlapped_step_is_the_serial_step_bit_for_bit():
    results = run_ranks(worker, 2, timeout=600)
    for rank, runs in enumerate(results):
        for case, (serial, overlapped) in runs.items():
            s_losses, s_norms, s_lrs, s_state, s_launched, _ = serial
            o_losses, o_norms, o_lrs, o_state, o_launched, seconds = overlapped
            skipped = s_launched[1]
            assert o_launched == (STEPS - skipped, skipped) and s_launched[0] == 0, o_launched
            assert (skipped > 0) == (case[0] == "fp16"), (case, skipped)
            assert seconds["update_behind"] > 0, seconds
            assert o_losses == s_losses, (rank, case, o_losses, s_losses)
            assert o_norms == s_norms, (rank, case)
            assert max(s_norms) > 0.05, s_norms  # the clip triggered
            assert o_lrs == s_lrs, (o_lrs, s_lrs)
            assert skipped or len(set(s_lrs)) == STEPS, s_lrs  # a new lr at every step
            assert o_state.keys() == s_state.keys()
            for key, value in s_state.items():
                assert torch.equal(o_state[key], value), (rank, case, key)


# --- mechanism: the forward gathered beside the update, each gather after its pieces -------------
def _mechanism(rank, world):
    import zerostream

    xs, ys = make_batches(3, GLOBAL_BATCH)
    torch.manual_seed(0)
    cfg = config(GLOBAL_BATCH // world, 1, "bf16", "none", 100, True)
    engine = zerostream.initialize(model=TinyGPT(), config=cfg)[0]
    opt = engine.optimizer
    lo = rank * (GLOBAL_BATCH // world)
    micro = slice(lo, lo + GLOBAL_BATCH // world)
    engine.backward(engine(xs[0][micro], ys[0][micro]))
    engine.step()  # the first update (the trace is recorded by the first forward)

    engine.backward(engine(xs[1][micro], ys[1][micro]))
    last_piece = opt._behind_pieces(opt._sinks(opt.local_partitions()))[-1]
    # The update waits before its last piece until the forward gathered beside it.
    log, held = watch(opt, last_piece)
    engine.step()
    loss = engine(xs[2][micro], ys[2][micro])  # gathers beside the held update
    engine.backward(loss)
    engine.step()
    engine.destroy()
    return log, held["waited"], last_piece, float(loss)


def _serial_third_loss(rank, world):
    import zerostream

    xs, ys = make_batches(3, GLOBAL_BATCH)
    torch.manual_seed(0)
    cfg = config(GLOBAL_BATCH // world, 1, "bf16", "none", 100, False)
    engine = zerostream.initialize(model=TinyGPT(), config=cfg)[0]
    return third_loss(engine, xs, ys, rank, world)


def test_the_forward_gathers_beside_the_update_each_after_the_pieces_of_its_shards():
    results = run_ranks(_mechanism, 2, timeout=300)
    serial = run_ranks(_serial_third_loss, 2, timeout=300)
    for rank, (log, waited, last_piece, loss) in enumerate(results):
        assert waited is True, "no gather ran while the update held its last piece"
        assert pieces_of(log)[-1] == tuple(last_piece), log
        assert gathers_beside(log, pieces_of(log), rank) >= 1, log
        assert loss == serial[rank], (loss, serial[rank])


# --- every other reader waits; a failing update is raised by the next wait -----------------------
def _read_right_after_step(rank, world, overlap, path):
    import zerostream

    xs, ys = make_batches(2, GLOBAL_BATCH)
    torch.manual_seed(0)
    cfg = config(GLOBAL_BATCH // world, 1, "bf16", "cpu", 100, overlap)
    engine = zerostream.initialize(model=TinyGPT(), config=cfg)[0]
    lo = rank * (GLOBAL_BATCH // world)
    for s in range(2):
        engine.backward(
            engine(xs[s][lo : lo + GLOBAL_BATCH // world], ys[s][lo : lo + GLOBAL_BATCH // world])
        )
        engine.step()
    if overlap:
        assert engine.optimizer.behind.running
    state = _weights_and_state(engine)  # the accessors, right after step()
    engine.save_checkpoint(path, tag="t")
    saved = torch.load(
        f"{path}/t/bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt", weights_only=False
    )
    engine.destroy()
    return state, saved["optimizer_state_dict"]


def test_readers_right_after_an_overlapped_step_see_the_finished_update(tmp_path):
    serial = run_ranks(_read_right_after_step, 2, False, str(tmp_path / "s"), timeout=300)
    overlapped = run_ranks(_read_right_after_step, 2, True, str(tmp_path / "o"), timeout=300)
    for (s_state, s_saved), (o_state, o_saved) in zip(serial, overlapped):
        for key, value in s_state.items():
            assert torch.equal(o_state[key], value), key
        for a, b in zip(s_saved["fp32_flat_groups"], o_saved["fp32_flat_groups"]):
            assert torch.equal(a, b)
        s_inner = s_saved["optimizer_state_dict"]["state"]
        o_inner = o_saved["optimizer_state_dict"]["state"]
        for k in s_inner:
            for name in ("exp_avg", "exp_avg_sq"):
                assert torch.equal(s_inner[k][name], o_inner[k][name]), (k, name)


def _failing_update(rank, world):
    import zerostream
    from zerostream.zero.overlap import UpdateFailed

    xs, ys = make_batches(2, GLOBAL_BATCH)
    torch.manual_seed(0)
    engine = zerostream.initialize(
        model=TinyGPT(), config=config(GLOBAL_BATCH, 1, "bf16", "none", 0, True)
    )[0]
    engine.backward(engine(xs[0], ys[0]))
    engine.step()
    engine.optimizer.settle_update()  # the first update ends before the kernel breaks
    inner = engine.optimizer.optimizer

    def broken(group, items, grad_scale):
        raise OSError(28, "No space left on device")

    inner._group_step = broken
    engine.backward(engine(xs[1], ys[1]))
    engine.step()  # returns: the update fails on its thread
    raised = []
    for what, call in (
        ("forward", lambda: engine(xs[1], ys[1])),
        ("backward", lambda: engine.backward(torch.ones((), requires_grad=True) * 1)),
        ("step", engine.step),
    ):
        try:
            call()
        except (UpdateFailed, RuntimeError) as e:
            raised.append((what, type(e).__name__, str(e)))
    engine.destroy()  # the run ends; destroy still releases what it holds
    return raised


def test_a_failing_update_is_raised_by_the_next_wait_and_the_run_stops():
    (raised,) = run_ranks(_failing_update, 1, timeout=300)
    assert [r[0] for r in raised] == ["forward", "backward", "step"], raised
    what, kind, text = raised[0]
    assert kind == "UpdateFailed", raised[0]
    assert "overlap_step" in text and "No space left on device" in text, text
    for _, _, later in raised[1:]:  # the run is inconsistent from then on
        assert "No space left on device" in later, later


@pytest.mark.parametrize(
    "zero, refused",
    [
        ({"stage": 2, "offload_optimizer": {"device": "cpu"}}, "got stage 2"),
        ({"stage": 3}, 'offload_optimizer.device "cpu" or "nvme"; got "none"'),
        ({"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}, "on the device"),
        (
            {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}},
            "got stage 2",
        ),
        (
            {
                "stage": 3,
                "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp", "ratio": 0.5},
            },
            "on the device",
        ),
    ],
)
def test_combinations_not_built_are_refused_by_name(zero, refused):
    from zerostream.config import ConfigError, load

    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero}
    cfg["zerostream"] = {"overlap_step": "next_forward"}
    with pytest.raises(ConfigError) as e:
        load(cfg)
    assert "zerostream.overlap_step" in str(e.value) and refused in str(e.value), str(e.value)


# --- the device's counters: the compute stream waits per gather, not for the whole step ----------
def _counted(rank, world, overlap):
    import zerostream
    from zerostream.testing import sim_device

    xs, ys = make_batches(3, GLOBAL_BATCH)
    with sim_device.installed(policy="lazy", seed=0, device_index=rank) as sim:
        torch.manual_seed(0)
        cfg = config(GLOBAL_BATCH, 1, "bf16", "none", 100, overlap)
        engine = zerostream.initialize(model=TinyGPT(), config=cfg)[0]
        device = engine.device
        counts = []
        for s in range(3):
            x, y = xs[s].to(device), ys[s].to(device)
            before = dict(sim.counters)
            loss = engine(x, y)
            mid = dict(sim.counters)
            engine.backward(loss)
            start = dict(sim.counters)
            engine.step()
            end = dict(sim.counters)
            counts.append(
                {
                    "forward": mid["compute_waits"] - before["compute_waits"],
                    "step": end["compute_waits"] - start["compute_waits"],
                    "step_host_syncs": end["main_thread_syncs"] - start["main_thread_syncs"],
                }
            )
        engine.destroy()
        violations = list(sim.violations)
        sim.violations.clear()
    return counts, violations


@pytest.mark.parametrize("mode", ["next_forward", "backward"])
def test_on_the_device_the_step_leaves_the_waits_to_each_gather_of_the_next_forward(mode):
    """Serial: step() makes the compute stream wait for its uploads (the fence), and the
    forward waits for nothing. Overlapped (and started during the backward, whose kept
    pieces upload behind the forward too): step() waits for nothing, on the device or on
    the main thread's host side; the next forward's compute stream waits instead, per
    gather."""
    ((serial, s_seen),) = run_ranks(_counted, 1, False, timeout=300)
    ((overlapped, o_seen),) = run_ranks(_counted, 1, mode, timeout=300)
    assert s_seen == [] and o_seen == [], (s_seen, o_seen)
    # Steps 2 and 3: the first forward recorded the trace; the second and third follow it.
    for s, o in zip(serial[1:], overlapped[1:]):
        assert s["step"] >= 1 and s["forward"] == 0, serial
        assert o["step"] == 0 and o["step_host_syncs"] == 0, overlapped
        assert o["forward"] > 1, overlapped
