"""zerostream.overlap_step "backward" (Note [The step started during the backward] in
zero/speculate.py): ZeRO-3 with offload_optimizer cpu starts the CPU update during the
backward, on the pieces whose gradients have all landed, with the factor of a step that
neither clips nor overflows, and step() keeps or puts back what it did.

Exactness: on 2 ranks the run is the serial run bit for bit (losses, norms, weights, the fp32
state) in each case: nothing clips (the speculation is kept), the clip triggers at every step
(all of it put back and redone), gradient accumulation (the fp32 landing through the copy
stage's slots), fp16 whose first steps overflow (put back, the step skipped) and later ones
kept. Mechanism: pieces really ran while autograd was in its backward, and kept pieces made
no second kernel call. On the simulated device, the thread's wait for the gradients'
downloads is needed (scripts/sync-mutations.py deletes it and this fails).
"""

import tempfile

import pytest
import torch

from full_state import full_state
from multirank import run_ranks
from overlap_trace import step_config
from tiny_gpt import TinyGPT, make_batches

STEPS = 4
GLOBAL_BATCH = 8


def config(micro, gas, dtype, params, persist, clip, overlap) -> dict:
    zero = {
        "stage": 3,
        "offload_optimizer": {"device": "cpu"},
        "stage3_param_persistence_threshold": persist,
        "reduce_bucket_size": 3000,
        "stage3_prefetch_bucket_size": 3000,
    }
    if params == "stage2":  # ZeRO-2: the buckets land during the backward too
        zero = {"stage": 2, "offload_optimizer": {"device": "cpu"}, "reduce_bucket_size": 3000}
    elif params == "nvme":  # shards written from the update's thread, read by the forward
        path = tempfile.mkdtemp()
        zero["offload_param"] = {"device": "nvme", "nvme_path": path, "max_in_cpu": 0}
    elif params != "none":
        zero["offload_param"] = {"device": params}
    cfg = step_config(micro, gas, dtype, zero, clip)
    if overlap:
        cfg["zerostream"] = {"overlap_step": overlap}
    return cfg


def _weights_and_state(engine) -> dict:
    return full_state(engine, ("exp_avg", "exp_avg_sq"))


def _small_pieces(spec) -> None:
    """The tiny model's partition in pieces of a few hundred elements (a real one's are cut
    at 64 Ki elements and the copy slot), each made ready by its own buckets; and the
    landing waits for the pieces it made ready, so that they run while the backward is
    still producing gradients whatever the threads' timing."""
    from zerostream.zero import overlap

    overlap.MERGE = 256
    spec.lockstep = True


def train(rank, world, case, overlap, on_device=False, model=TinyGPT):
    import torch.distributed as dist

    import zerostream

    dtype, params, persist, gas, clip = case
    micro = GLOBAL_BATCH // (world * gas)
    xs, ys = make_batches(STEPS, GLOBAL_BATCH)
    torch.manual_seed(0)
    cfg = config(micro, gas, dtype, params, persist, clip, overlap)
    engine = zerostream.initialize(model=model(), config=cfg)[0]
    spec = engine.optimizer.speculation
    ran_in = []
    if spec is not None:
        _small_pieces(spec)
        spec.log = ran_in
    losses, norms = [], []
    for s in range(STEPS):
        total = torch.zeros(())
        for m in range(gas):
            lo = (m * world + rank) * micro
            x, y = xs[s][lo : lo + micro], ys[s][lo : lo + micro]
            if on_device:
                x, y = x.to(engine.device), y.to(engine.device)
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
            total += loss.detach().float().cpu()
        if world > 1:
            dist.all_reduce(total)
        losses.append(float(total))
        norms.append(float(engine.get_global_grad_norm()))
    counts = None
    if spec is not None:
        counts = {
            "speculated": spec.speculated_elements,
            "kept": spec.kept_elements,
            "late": spec.late_elements,
            "states": sorted({state for _, state, _, _ in ran_in}),
            # pieces updated before every gradient of their backward had landed
            "early": sum(1 for _, _, landed, total in ran_in if landed < total),
        }
    state = _weights_and_state(engine)
    skipped = engine.skipped_steps
    engine.destroy()
    return losses, norms, state, counts, skipped


CASES = [
    ("bf16", "none", 0, 1, 0.0),  # nothing clips: the speculation stands
    ("bf16", "cpu", 100, 1, 0.05),  # the clip triggers at every step: all of it put back
    ("bf16", "nvme", 100, 1, 0.0),  # shards on NVMe: kept pieces written behind the forward
    ("fp32", "none", 100, 2, 0.0),  # accumulation: speculated on the second micro-step only
    ("fp16", "none", 100, 1, 0.0),  # the first steps overflow (put back), later ones kept
    ("bf16", "stage2", 0, 1, 0.0),  # stage 2: kept, then step() updates the rest
    ("fp32", "stage2", 0, 2, 0.05),  # stage 2, accumulation, the clip triggers: put back
]


def worker(rank, world):
    return {
        case: (train(rank, world, case, None), train(rank, world, case, "backward"))
        for case in CASES
    }


def test_the_step_started_during_the_backward_is_the_serial_step_bit_for_bit():
    results = run_ranks(worker, 2, timeout=600)
    for rank, runs in enumerate(results):
        for case, (serial, spec) in runs.items():
            s_losses, s_norms, s_state, _, s_skipped = serial
            o_losses, o_norms, o_state, counts, o_skipped = spec
            assert o_losses == s_losses, (rank, case, o_losses, s_losses)
            assert o_norms == s_norms, (rank, case)
            assert o_skipped == s_skipped and (s_skipped > 0) == (case[0] == "fp16"), case
            for key, value in s_state.items():
                assert torch.equal(o_state[key], value), (rank, case, key)
            # The mechanism: pieces ran during autograd's backward, and step() kept them
            # exactly when nothing clipped.
            assert counts["speculated"] > 0 and counts["states"] == ["BACKWARD"], (case, counts)
            assert counts["early"] >= STEPS, (case, counts)
            if case[4] > 0:
                assert max(s_norms) > case[4] and counts["kept"] == 0, (case, counts, s_norms)
            else:
                assert counts["kept"] > 0, (case, counts)


def _late_parts(rank, world):
    import functools

    model = functools.partial(TinyGPT, checkpoint="reentrant", reuse=True)
    case = ("bf16", "none", 0, 1, 0.0)
    return train(rank, world, case, None, model=model), train(
        rank, world, case, "backward", model=model
    )


def _ranks_differ(rank, world):
    """Rank 0 has no room for copies (it speculates nothing), rank 1 room for all."""
    import zerostream

    case = ("bf16", "none", 100, 1, 0.0)
    serial = train(rank, world, case, None)
    original = zerostream.initialize

    def initialize(*args, **kwargs):
        kwargs["config"]["zerostream"]["speculative_step_bytes"] = 0 if rank == 0 else 1 << 30
        return original(*args, **kwargs)

    zerostream.initialize = initialize
    try:
        return serial, train(rank, world, case, "backward")
    finally:
        zerostream.initialize = original


def test_ranks_that_speculate_differently_issue_the_same_collectives_and_the_same_step():
    """What a rank speculates is its own (its landing, its budget, its thread's timing): no
    collective depends on it (run_ranks compares the ranks' collective sequences)."""
    results = run_ranks(_ranks_differ, 2, timeout=600)
    for rank, (serial, spec) in enumerate(results):
        assert spec[0] == serial[0] and spec[1] == serial[1], rank
        for key, value in serial[2].items():
            assert torch.equal(spec[2][key], value), (rank, key)
        assert (spec[3]["speculated"] > 0) == (rank == 1), (rank, spec[3])


def test_a_piece_that_gets_more_gradient_after_its_update_is_updated_again():
    """Reentrant checkpointing with the last block run twice: its params' gradients come in
    two parts, two inner backwards apart (Note [A gradient that arrives in parts]); a piece
    updated after the first part is put back and updated again at step()."""
    for serial, spec in run_ranks(_late_parts, 2, timeout=600):
        assert spec[0] == serial[0] and spec[1] == serial[1], (spec[0], serial[0])
        for key, value in serial[2].items():
            assert torch.equal(spec[2][key], value), key
        counts = spec[3]
        assert counts["late"] > 0 and counts["kept"] > 0, counts


def _changed_in_place(rank, world, overlap, mode):
    """The lr as a tensor a scheduler fills, or betas as a list changed in place, between
    the backward and step(): the speculation read the old values."""
    import zerostream

    xs, ys = make_batches(3, GLOBAL_BATCH)
    torch.manual_seed(0)
    cfg = config(GLOBAL_BATCH, 1, "bf16", "none", 0, 0.0, overlap)
    del cfg["scheduler"]
    engine = zerostream.initialize(model=TinyGPT(), config=cfg)[0]
    spec = engine.optimizer.speculation
    if spec is not None:
        _small_pieces(spec)
    groups = engine.optimizer.param_groups
    for g in groups:
        if mode == "tensor":
            g["lr"] = torch.tensor(1e-2, dtype=torch.float64)
        else:
            g["betas"] = list(g["betas"])
    for s in range(3):
        engine.backward(engine(xs[s], ys[s]))
        for g in groups:
            if mode == "tensor":
                g["lr"].fill_(1e-3 * (s + 2))
            else:
                g["betas"][0] = 0.5 + 0.1 * s
        engine.step()
    out = _weights_and_state(engine)
    counts = None if spec is None else (spec.speculated_elements, spec.kept_elements)
    engine.destroy()
    return out, counts


@pytest.mark.parametrize("mode", ["tensor", "list"])
def test_a_hyperparameter_changed_in_place_after_the_backward_puts_the_speculation_back(mode):
    ((serial, _),) = run_ranks(_changed_in_place, 1, None, mode, timeout=300)
    ((spec, counts),) = run_ranks(_changed_in_place, 1, "backward", mode, timeout=300)
    assert counts[0] > 0 and counts[1] == 0, counts
    for key, value in serial.items():
        assert torch.equal(spec[key], value), key


def _readers_undo(rank, world):
    """A backward that ends the accumulation, then readers before step(): each sees the
    state as it was before the speculation (every copy put back)."""
    import zerostream

    xs, ys = make_batches(2, GLOBAL_BATCH)
    torch.manual_seed(0)
    cfg = config(GLOBAL_BATCH, 1, "bf16", "none", 0, 0.0, "backward")
    engine = zerostream.initialize(model=TinyGPT(), config=cfg)[0]
    engine.backward(engine(xs[0], ys[0]))
    engine.step()
    engine.optimizer.settle_update()
    before = _weights_and_state(engine)
    engine.backward(engine(xs[1], ys[1]))
    speculated = engine.optimizer.speculation.speculated_elements
    after = _weights_and_state(engine)  # the accessors put the speculation back
    engine.zero_grad()
    engine.destroy()
    return before, after, speculated


def test_a_reader_before_the_step_sees_the_state_without_the_speculation():
    ((before, after, speculated),) = run_ranks(_readers_undo, 1, timeout=300)
    assert speculated > 0
    for key, value in before.items():
        assert torch.equal(after[key], value), key


def _budget(rank, world, budget):
    import zerostream

    xs, ys = make_batches(2, GLOBAL_BATCH)
    torch.manual_seed(0)
    cfg = config(GLOBAL_BATCH, 1, "bf16", "none", 0, 0.0, "backward")
    cfg["zerostream"]["speculative_step_bytes"] = budget if budget != "one" else 0
    engine = zerostream.initialize(model=TinyGPT(), config=cfg)[0]
    opt = engine.optimizer
    spec = opt.speculation
    _small_pieces(spec)
    sizes = [hi - lo for _, lo, hi in opt._behind_pieces(opt._sinks(opt.local_partitions()))]
    if budget == "one":  # room for the copies of the largest piece only (Adam: 12 B each)
        spec.budget = 12 * max(sizes) + 24
    pools = []
    for s in range(2):
        engine.backward(engine(xs[s], ys[s]))
        engine.step()
        pools.append(None if spec._pool is None else spec._pool.data_ptr())
    # the copies' pool is allocated once, within the budget, and reused by the next backward
    assert pools[0] is None or (pools[0] == pools[1] and spec._pool.numel() <= spec.budget)
    out = (spec.speculated_elements, sizes, spec.budget)
    engine.destroy()
    return out


def test_the_copies_stay_within_speculative_step_bytes():
    ((none, _, _),) = run_ranks(_budget, 1, 0, timeout=300)
    ((some, sizes, budget),) = run_ranks(_budget, 1, "one", timeout=300)
    ((all_, _, _),) = run_ranks(_budget, 1, 1 << 30, timeout=300)
    assert none == 0
    assert len(sizes) > 1 and sum(sizes) > max(sizes), sizes
    # Each of the 2 steps speculates at most the budget's worth, and at least one piece.
    assert 0 < some <= 2 * (budget // 12) < all_, (some, budget, all_, sizes)
    assert all_ <= 2 * sum(sizes)


@pytest.mark.parametrize(
    "zero, refused",
    [
        ({"stage": 1, "offload_optimizer": {"device": "cpu"}}, "nothing lands during"),
        ({"stage": 0}, "got stage 0"),
        ({"stage": 3}, 'offload_optimizer.device "cpu"; got "none"'),
        ({"stage": 2}, 'offload_optimizer.device "cpu"; got "none"'),
        (
            {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}},
            'got "nvme" (the NVMe sub-group pipeline runs behind the next forward',
        ),
        ({"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}, "on the device"),
        (
            {"stage": 2, "offload_optimizer": {"device": "cpu"}, "zenflow": {"topk_ratio": 0.1}},
            "zero_optimization.zenflow",
        ),  # fmt: skip
        (
            {"stage": 2, "offload_optimizer": {"device": "cpu"}, "unmanaged": True},
            "managed_gradient_accumulation false",
        ),  # fmt: skip
    ],
)
def test_combinations_not_built_are_refused_by_name(zero, refused):
    from zerostream.config import ConfigError, load

    zero = dict(zero)
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero}
    if zero.pop("unmanaged", False):
        cfg["managed_gradient_accumulation"] = False
    cfg["zerostream"] = {"overlap_step": "backward"}
    with pytest.raises(ConfigError) as e:
        load(cfg)
    text = str(e.value)
    assert 'zerostream.overlap_step: "backward"' in text and refused in text, text


# --- on the simulated device: the thread waits for the gradients' downloads ----------------------
def _on_device(rank, world, policy, overlap, params):
    from zerostream.testing import sim_device

    with sim_device.installed(policy=policy, seed=rank, device_index=rank) as sim:
        out = train(rank, world, ("bf16", params, 100, 1, 0.0), overlap, on_device=True)
        violations = list(sim.violations)
        sim.violations.clear()
    return out, violations


@pytest.mark.parametrize("policy, params", [("lazy", "none"), ("random", "none"),
                                            ("lazy", "stage2")])  # fmt: skip
def test_on_the_simulated_device_the_speculation_is_the_serial_step(policy, params):
    serial = run_ranks(_on_device, 2, policy, None, params, timeout=600)
    spec = run_ranks(_on_device, 2, policy, "backward", params, timeout=600)
    for (s, s_seen), (o, o_seen) in zip(serial, spec):
        assert s_seen == [] and o_seen == [], (s_seen, o_seen)
        assert o[0] == s[0] and o[1] == s[1], (o[0], s[0])
        for key, value in s[2].items():
            assert torch.equal(o[2][key], value), key
        assert o[3]["kept"] > 0, o[3]
