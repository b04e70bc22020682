"""The stage seam without processes: each test builds a stage from a StageContext with a
pretend world size (no process group) and checks one behaviour (STYLE.md item 13, tier 1)."""

import copy

import pytest
import torch

from mlp import MLP
from zerostream import _C
from zerostream.config import load
from zerostream.precision import make_loss_scaler
from zerostream.telemetry import StepTelemetry
from zerostream.zero.factory import build_zero_optimizer, stage_class
from zerostream.zero.flat import FlatGroup
from zerostream.zero.grad_reduce import Stage2Reducer, choose_collective, widest_owner
from zerostream.zero.protocol import RunState, StageContext, TrainingState, ZeroOptimizer
from zerostream.zero.stage0 import ReplicatedOptimizer
from zerostream.zero.stage3.optimizer import Stage3Optimizer
from zerostream.zero.stage12 import PartitionedOptimizer


def _config(stage, **zero):
    return load(
        {
            "train_batch_size": 2,
            "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
            "zero_optimization": {"stage": stage, **zero},
        },
        world_size=1,
        log=False,
    )


def _ctx(cfg, world=1, rank=0, telemetry=None):
    kwargs = {"telemetry": telemetry} if telemetry is not None else {}
    return StageContext(
        config=cfg,
        group=None,
        rank=rank,
        world=world,
        device=torch.device("cpu"),
        loss_scaler=make_loss_scaler(cfg.fp16),
        run=RunState(),
        **kwargs,
    )


def _stage(cfg, seed=0, client=None):
    """A model placed by its stage and the stage's optimizer, as the engine builds them."""
    torch.manual_seed(seed)
    model = MLP()
    ctx = _ctx(cfg)
    stage_class(cfg.zero_stage).prepare_module(model, ctx)
    opt = build_zero_optimizer(ctx, [{"params": list(model.parameters())}], client=client)
    return model, opt, ctx


def _train(model, opt, ctx, steps, seed=1):
    """The engine's call order (Note [Stage seam]) with its phases; returns the losses."""
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        x = torch.randn(4, 8, generator=gen)
        ctx.run.state = TrainingState.FORWARD
        opt.before_forward()
        loss = model(x)
        opt.after_forward()
        ctx.run.state = TrainingState.BACKWARD
        loss.backward()
        opt.after_backward()
        ctx.run.state = TrainingState.STEP
        assert opt.step()
        ctx.run.state = TrainingState.IDLE
        losses.append(float(loss.detach()))
    return losses


# --- the factory --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "stage,cls",
    [
        (0, ReplicatedOptimizer),
        (1, PartitionedOptimizer),
        (2, PartitionedOptimizer),
        (3, Stage3Optimizer),
    ],
)
def test_the_factory_builds_the_stage_class_which_implements_the_protocol(stage, cls):
    _, opt, _ = _stage(_config(stage))
    assert type(opt) is cls and isinstance(opt, ZeroOptimizer)


def test_each_stage_has_its_own_class():
    assert [stage_class(s) for s in range(4)] == [
        ReplicatedOptimizer,
        PartitionedOptimizer,
        PartitionedOptimizer,
        Stage3Optimizer,
    ]


def test_a_partitioned_stage_without_an_optimizer_names_the_missing_section():
    cfg = load({"train_batch_size": 2, "zero_optimization": {"stage": 2}}, world_size=1, log=False)
    with pytest.raises(ValueError, match="stage 2 requires an optimizer"):
        _stage(cfg)
    cfg0 = load({"train_batch_size": 2}, world_size=1, log=False)
    assert _stage(cfg0)[1] is None  # stage 0 inference: no optimizer at all


def test_nvme_offload_with_a_client_optimizer_is_refused(tmp_path):
    cfg = _config(2, offload_optimizer={"device": "nvme", "nvme_path": str(tmp_path)})
    with pytest.raises(NotImplementedError, match='offload_optimizer.device "nvme"'):
        _stage(cfg, client=lambda groups: torch.optim.AdamW(groups))


def test_prepare_module_moves_params_to_the_run_dtype_and_keeps_buffers():
    cfg = load({"train_batch_size": 2, "bf16": {"enabled": True}}, world_size=1, log=False)
    model = torch.nn.BatchNorm1d(4)
    stage_class(0).prepare_module(model, _ctx(cfg))
    assert model.weight.dtype == torch.bfloat16
    assert model.running_mean.dtype == torch.float32


# --- the phase ----------------------------------------------------------------------------------


def test_a_plain_backward_at_stage_2_runs_its_epilogue_when_autograd_ends():
    """Note [A plain loss.backward()]: outside run_backward (the phase stays idle) the first
    gradient hook queues after_backward, so when loss.backward() returns the buckets are
    reduced into the partition, nothing waits in a bucket, and the gradients are held; the
    partition equals the one run_backward leaves."""
    x = torch.randn(4, 8)
    grads = {}
    for plain in (True, False):
        model, opt, ctx = _stage(_config(2, reduce_bucket_size=50))
        loss = model(x)
        if plain:
            loss.backward()
            assert ctx.run.state is TrainingState.IDLE
            assert not any(opt.reducer.order.held) and not opt._epilogue_queued
        else:
            opt.run_backward(loss, 1.0)
        assert opt.holding_grads
        grads[plain] = opt.grads[0].clone()
    assert grads[True].abs().sum() > 0
    assert torch.equal(grads[True], grads[False])


class _FailsInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("user backward failed")


def test_a_plain_backward_after_one_that_raised_still_runs_its_epilogue():
    """A backward that raised after some gradient hooks ran never runs its queued
    callback; the next forward (before_forward, as the engine calls it) forgets it, so the
    next plain backward queues its own."""
    model, opt, ctx = _stage(_config(2, reduce_bucket_size=50))
    x = torch.randn(4, 8, requires_grad=True)  # so the failing node runs, last
    broken = model.b(torch.relu(model.a(_FailsInBackward.apply(x)))).pow(2).mean()
    with pytest.raises(RuntimeError, match="user backward failed"):
        broken.backward()  # model.b's and model.a's hooks fired first
    assert opt._epilogue_queued  # its callback never ran
    opt.zero_grad()
    opt.before_forward()
    model(x).backward()
    assert not any(opt.reducer.order.held) and opt.holding_grads
    assert not opt._epilogue_queued


# --- flat groups and gradient reduction ---------------------------------------------------------


def _flat(numels, world, rank):
    return FlatGroup([torch.nn.Parameter(torch.zeros(n)) for n in numels], world, rank)


def test_flat_group_ranges_come_from_the_native_partition_function():
    flat = _flat([5, 7, 3], world=4, rank=2)
    assert flat.ranges == [_C.stage12_partition(15, 4, r) for r in range(4)]
    begin, numel, _ = flat.ranges[3]
    assert flat.partition(3).data_ptr() == flat.buffer[begin:].data_ptr()
    assert flat.partition(3).numel() == numel


def test_bucket_pieces_tile_the_bucket_once_and_land_in_their_owners_partitions():
    world = 4
    cfg = _config(2)
    flats = [_flat([5, 7, 3, 9], world, 0)]
    targets = [torch.zeros(flats[0].partition_numel)]
    reducer = Stage2Reducer(flats, targets, _ctx(cfg, world=world))
    slots = flats[0].slots
    bucket = [
        (0, s, torch.arange(s.offset, s.offset + s.numel, dtype=torch.float32))
        for s in reversed(slots)
    ]  # autograd order
    flat_grads = torch.cat([g for _, _, g in bucket])
    covered = torch.zeros(flat_grads.numel(), dtype=torch.int64)
    for r, pieces in enumerate(reducer.owner_pieces([(gi, s) for gi, s, _ in bucket])):
        begin = flats[0].ranges[r][0]
        for p in pieces:
            covered[p.lo : p.hi] += 1
            # The values are their own flat index: a piece lands where the rank owns them.
            assert torch.equal(
                flat_grads[p.lo : p.hi],
                torch.arange(
                    begin + p.part_lo, begin + p.part_lo + p.hi - p.lo, dtype=torch.float32
                ),
            )
    assert torch.all(covered == 1)


def test_the_collective_moving_fewer_bytes_is_chosen():
    world = 4
    flats = [_flat([40, 40, 40, 40], world, 0)]  # partitions of 40: one param per rank
    reducer = Stage2Reducer(flats, [torch.zeros(40)], _ctx(_config(2), world=world))
    slots = flats[0].slots
    everything = [(0, s) for s in slots]
    one_owner = [(0, slots[0])]
    assert (
        choose_collective(widest_owner(reducer.owner_pieces(everything)), 160, world)
        == "reduce_scatter"
    )
    assert (
        choose_collective(widest_owner(reducer.owner_pieces(one_owner)), 40, world) == "all_reduce"
    )


# --- sub-groups ---------------------------------------------------------------------------------


def test_sub_group_size_zero_gives_one_sub_group_per_parameter_piece():
    flat = _flat([5, 7, 3, 9], world=2, rank=1)  # rank 1 owns [12, 24): 3 of p2, 9 of p3
    starts = flat.param_starts()
    assert starts == [0, 3]
    plan = _C.plan_sub_groups([flat.partition_numel], [starts], 0)
    assert plan == [(0, 0, 3), (0, 3, flat.partition_numel)]
    assert _C.plan_sub_groups([flat.partition_numel], [starts], 5) == [
        (0, 0, 5),
        (0, 5, 10),
        (0, 10, 12),
    ]


# --- checkpoint state ---------------------------------------------------------------------------


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_state_dict_resumes_bit_identically(stage):
    cfg = _config(stage)
    model, opt, ctx = _stage(cfg)
    _train(model, opt, ctx, 2)
    weights = copy.deepcopy(model.state_dict())
    state = copy.deepcopy(opt.state_dict())
    expected = _train(model, opt, ctx, 3, seed=7)

    resumed, opt2, ctx2 = _stage(cfg, seed=123)  # other initial weights: all must come back
    resumed.load_state_dict(weights)
    opt2.load_state_dict(state)
    assert _train(resumed, opt2, ctx2, 3, seed=7) == expected
    for a, b in zip(model.parameters(), resumed.parameters()):
        assert torch.equal(a, b)


def test_the_optimizer_refuses_state_of_another_world_size():
    """Resharding is the checkpoint loader's (tests/python/checkpoint/test_resume.py); the
    optimizer itself only takes a state cut for its own world size."""
    model, opt, _ = _stage(_config(1))
    state = opt.state_dict()
    state["partition_count"] = [4]
    with pytest.raises(ValueError, match="saved by 4 data-parallel ranks; this run has 1"):
        opt.load_state_dict(state)


# --- inspection and telemetry -------------------------------------------------------------------


def test_state_summary_says_where_the_state_lives_with_telemetry_on_or_off():
    for telemetry in (None, StepTelemetry()):
        cfg = _config(2, offload_optimizer={"device": "cpu"})
        torch.manual_seed(0)
        model = MLP()
        ctx = _ctx(cfg, telemetry=telemetry)
        stage_class(2).prepare_module(model, ctx)
        opt = build_zero_optimizer(ctx, [{"params": list(model.parameters())}])
        _train(model, opt, ctx, 1)
        summary = opt.state_summary()
        numel = sum(p.numel() for p in model.parameters())
        assert summary["offload"] == "cpu" and summary["optimizer"] == "DeepSpeedCPUAdam"
        assert summary["fp32_master_numel"] >= numel and summary["full_grads_left"] == 0
        assert summary["optimizer_state_numel"]["exp_avg"] == summary["fp32_master_numel"]
        if telemetry is not None:
            assert telemetry.seconds["reduce"] > 0


@pytest.mark.parametrize(("world", "rank"), [(2, -1), (2, 2), (0, 0)])
def test_a_flat_group_names_a_bad_rank_or_world(world, rank):
    params = [torch.nn.Parameter(torch.zeros(10)), torch.nn.Parameter(torch.zeros(7))]
    with pytest.raises(ValueError, match=r"(rank|world) must be"):
        FlatGroup(params, world, rank)


def test_a_flat_group_past_int64_elements_is_a_value_error():
    huge = torch.nn.Parameter(torch.empty(2**62, dtype=torch.uint8, device="meta"), False)
    with pytest.raises(ValueError, match=r"more than a 64-bit element count"):
        FlatGroup([huge, huge, huge], 2, 0)
