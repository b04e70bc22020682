"""zerostream.overlap_step "next_forward" with offload_optimizer "nvme": the sub-group pipeline
(offload/optimizer_swap.py) runs on the update's thread behind the next forward, the
persistent params' ranges first (Note [Persistent ranges first] in offload/swap_early.py),
with offload_param none, cpu and nvme (Note [Shard writes beside the forward's reads] in
zero/stage3/shard_writes.py).

Exactness: on 2 ranks the overlapped run is the serial run bit for bit (losses, pre-clip
norms, weights, the fp32 state and moments read back from disk), with clipping that
triggers, an lr that changes every step, the host tier holding part of the state,
gradient accumulation and fp16 overflows. Mechanism: the persistent ranges were updated
before any sub-group, a window read of their state moved bytes, the forward gathered while
the update still held its last piece, and each gather ran after the pieces of its shards.
"""

import torch

from full_state import full_state
from multirank import run_ranks
from overlap_trace import gathers_beside, step_config, third_loss, train_steps, watch
from tiny_gpt import TinyGPT, make_batches

STEPS = 4
GLOBAL_BATCH = 8


def config(case, overlap: bool, nvme: str) -> dict:
    dtype, params, in_cpu, gas = case
    zero = {
        "stage": 3,
        "offload_optimizer": {"device": "nvme", "nvme_path": f"{nvme}/opt"},
        "stage3_param_persistence_threshold": 100,  # biases and norms: persistent
        "sub_group_size": 2000,  # several sub-groups per rank
        "reduce_bucket_size": 3000,
        "stage3_prefetch_bucket_size": 3000,
    }
    if params != "none":
        # max_in_cpu 0: every shard on disk (DeepSpeed's default keeps 1e9 elements in RAM)
        zero["offload_param"] = {"device": params, "nvme_path": f"{nvme}/param", "max_in_cpu": 0}
    cfg = step_config(GLOBAL_BATCH // (2 * gas), gas, dtype, zero)
    cfg["zerostream"] = {"optimizer_max_in_cpu": in_cpu}
    if overlap:
        cfg["zerostream"]["overlap_step"] = "next_forward"
    return cfg


def train(rank, world, case, overlap, nvme):
    import torch.distributed as dist

    import zerostream

    gas = case[3]
    xs, ys = make_batches(STEPS, GLOBAL_BATCH)
    torch.manual_seed(0)
    engine = zerostream.initialize(model=TinyGPT(), config=config(case, overlap, nvme))[0]
    losses, norms, lrs = train_steps(engine, xs, ys, rank, world, gas)
    opt = engine.optimizer
    launched = opt.behind.launched if opt.behind is not None else 0
    tiers = {s.tier for s in opt.swapper.sub_groups}
    shards = opt.part.swapper
    if shards is not None:  # offload_param nvme: the shards really went to disk every step
        tiers.add(f"shard writes {shards.stats()['writes'] > 0}")
    state = full_state(engine)
    dist.barrier()
    engine.destroy()
    return losses, norms, lrs, state, (launched, engine.skipped_steps), tiers


CASES = [
    ("bf16", "none", 0, 1),  # every sub-group on disk, shards on the device
    ("bf16", "nvme", 4000, 1),  # shards on disk too; two sub-groups in the host tier
    ("fp32", "cpu", 0, 2),  # gradient accumulation: one update per two micro-steps
    ("fp16", "nvme", 0, 1),  # overflowed steps are skipped, the others overlapped
]


def worker(rank, world, root):
    return {
        case: tuple(
            train(rank, world, case, overlap, f"{root}/{i}{int(overlap)}")
            for overlap in (False, True)
        )
        for i, case in enumerate(CASES)
    }


def test_the_overlapped_nvme_step_is_the_serial_step_bit_for_bit(tmp_path):
    results = run_ranks(worker, 2, str(tmp_path), timeout=900)
    for rank, runs in enumerate(results):
        for case, (serial, overlapped) in runs.items():
            s_losses, s_norms, s_lrs, s_state, s_launched, s_tiers = serial
            o_losses, o_norms, o_lrs, o_state, o_launched, o_tiers = overlapped
            skipped = s_launched[1]
            assert s_launched[0] == 0 and o_launched == (STEPS - skipped, skipped), o_launched
            assert (skipped > 0) == (case[0] == "fp16"), (case, skipped)
            assert s_tiers == o_tiers and ("host" in s_tiers) == (case[2] > 0), s_tiers
            assert ("shard writes True" in s_tiers) == (case[1] == "nvme"), s_tiers
            assert o_losses == s_losses, (rank, case, o_losses, s_losses)
            assert o_norms == s_norms and max(s_norms) > 0.05, (rank, case, o_norms, s_norms)
            assert o_lrs == s_lrs and (skipped or len(set(s_lrs)) == STEPS), s_lrs
            assert o_state.keys() == s_state.keys()
            for key, value in s_state.items():
                assert torch.equal(o_state[key], value), (rank, case, key)


# --- mechanism: persistent ranges first, the forward gathering beside the rest -------------------
def _mechanism(rank, world, root):
    import zerostream
    from zerostream.offload.swap_early import EarlyRanges

    case = ("bf16", "nvme", 0, 1)
    xs, ys = make_batches(3, GLOBAL_BATCH)
    torch.manual_seed(0)
    engine = zerostream.initialize(model=TinyGPT(), config=config(case, True, root))[0]
    opt = engine.optimizer
    micro = slice(rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world)
    engine.backward(engine(xs[0][micro], ys[0][micro]))
    engine.step()  # the first update (the first forward recorded the trace)

    engine.backward(engine(xs[1][micro], ys[1][micro]))
    partitions = opt._sinks(opt.local_partitions())
    early = EarlyRanges(opt.swapper, opt._early_ranges())
    plan = opt.swapper.update_pieces(partitions, early)
    first_rest = plan[len(early.pieces(partitions))]
    # The update stops before its first sub-group until the forward has gathered: the
    # forward's start needs the persistent params, which must be updated already.
    log, held = watch(opt, first_rest)
    read_before = opt.swapper.window_bytes_read
    engine.step()
    loss = engine(xs[2][micro], ys[2][micro])  # gathers beside the held update
    engine.backward(loss)
    engine.step()
    windows = opt.swapper.window_bytes_read - read_before
    engine.destroy()
    return log, held["waited"], plan, len(early.pieces(partitions)), float(loss), windows


def _serial_third_loss(rank, world, root):
    import zerostream

    xs, ys = make_batches(3, GLOBAL_BATCH)
    torch.manual_seed(0)
    engine = zerostream.initialize(
        model=TinyGPT(), config=config(("bf16", "nvme", 0, 1), False, root)
    )[0]
    return third_loss(engine, xs, ys, rank, world)


def test_persistent_ranges_go_first_and_the_forward_gathers_beside_the_rest(tmp_path):
    results = run_ranks(_mechanism, 2, str(tmp_path / "o"), timeout=300)
    serial = run_ranks(_serial_third_loss, 2, str(tmp_path / "s"), timeout=300)
    for rank, (log, waited, plan, n_early, loss, windows) in enumerate(results):
        assert loss == serial[rank], (loss, serial[rank])  # no gather read a stale shard
        assert waited is True, "the forward did not gather while the update held its sub-groups"
        assert n_early > 0 and windows > 0, (n_early, windows)
        pieces = [tuple(e[1:]) for e in log if e[0] == "piece"]
        assert pieces[: len(plan)] == [tuple(p) for p in plan], "pieces ran out of plan order"
        beside = gathers_beside(log, plan, rank)
        assert beside >= 1, log


# --- a disk error on the update's thread is raised by the next wait, naming it -------------------
def _failing_update(rank, world, root):
    import zerostream
    from zerostream.offload.fault_injection import io_faults_injected, set_io_fault
    from zerostream.zero.overlap import UpdateFailed

    xs, ys = make_batches(2, GLOBAL_BATCH)
    torch.manual_seed(0)
    cfg = config(("bf16", "none", 0, 1), True, root)
    cfg["train_micro_batch_size_per_gpu"] = GLOBAL_BATCH
    engine = zerostream.initialize(model=TinyGPT(), config=cfg)[0]
    engine.backward(engine(xs[0], ys[0]))
    engine.step()
    engine.optimizer.settle_update()
    engine.backward(engine(xs[1], ys[1]))
    set_io_fault("1:ENOSPC")  # the next I/O: the update's own, on its thread
    raised = []
    try:
        engine.step()  # returns: the update fails on its thread
        for what, call in (
            ("forward", lambda: engine(xs[1], ys[1])),
            ("step", engine.step),
        ):
            try:
                call()
            except UpdateFailed as e:
                raised.append((what, str(e)))
    finally:
        injected = io_faults_injected()
        set_io_fault(None)
    engine.destroy()
    return injected, raised


def test_a_disk_error_on_the_update_is_raised_by_the_next_wait(tmp_path):
    ((injected, raised),) = run_ranks(_failing_update, 1, str(tmp_path), timeout=300)
    assert injected == 1, injected
    assert [r[0] for r in raised] == ["forward", "step"], raised
    text = raised[0][1]
    assert "overlap_step" in text and "No space left on device" in text, text
