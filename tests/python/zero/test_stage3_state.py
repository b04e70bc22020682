"""Stage 3's explicit state (issue 29 part 3): a shard's home (param.ShardHome, changed only by
the checked ZeroParam.move_shard), the coordinator's phase (coordinator.Phase, tracked from its
own hooks, not from autograd's internals), and the per-module registry (module_state.py)."""

import pytest
import torch
import torch.nn as nn

from multirank import run_ranks
from tiny_gpt import TinyGPT, make_batches


def _zero_param(numel: int = 10, world: int = 2):
    from zerostream.zero.stage3.param import ZeroParam

    return ZeroParam(nn.Parameter(torch.randn(numel)), 7, world, 0, torch.device("cpu"))


def test_a_shard_moves_only_along_the_allowed_homes():
    from zerostream.zero.stage3.param import ShardHome

    zp = _zero_param()  # 10 elements over 2 ranks: 5 per shard
    assert zp.home is None and zp.shard is None
    with pytest.raises(RuntimeError, match="from unplaced to host_arena"):
        zp.move_shard(ShardHome.HOST_ARENA, torch.zeros(5))  # only a partitioner's adopt
    zp.move_shard(ShardHome.HOST, torch.zeros(5))
    assert zp.param.ds_tensor is zp.shard
    arena = torch.arange(5.0)
    zp.move_shard(ShardHome.HOST_ARENA, arena)
    with pytest.raises(RuntimeError, match="from host_arena to host"):
        zp.move_shard(ShardHome.HOST, torch.zeros(5))  # never back to pageable memory
    with pytest.raises(RuntimeError, match="of 4 elements; expected 5"):
        zp.move_shard(ShardHome.HOST_ARENA, torch.zeros(4))
    with pytest.raises(RuntimeError, match="moving to nvme keeps no tensor"):
        zp.move_shard(ShardHome.NVME, arena)
    with pytest.raises(RuntimeError, match="moving to host_arena has no tensor"):
        zp.move_shard(ShardHome.HOST_ARENA)
    assert zp.home is ShardHome.HOST_ARENA and zp.shard is arena  # refused moves change nothing
    zp.move_shard(ShardHome.NVME)
    assert zp.on_nvme and zp.shard is None and zp.param.ds_tensor.numel() == 0
    with pytest.raises(RuntimeError, match="from nvme to nvme"):
        zp.move_shard(ShardHome.NVME)


def test_the_coordinator_refuses_phases_out_of_order():
    from zerostream.zero.stage3.coordinator import ParamCoordinator, Phase
    from zerostream.zero.stage3.partitioner import Partitioner

    coord = ParamCoordinator(Partitioner(None, torch.device("cpu"), None, world=1, rank=0))
    assert coord.phase is Phase.IDLE
    with pytest.raises(RuntimeError, match="recompute cannot follow idle"):
        coord._enter(Phase.RECOMPUTE)
    with pytest.raises(RuntimeError, match="post_backward cannot follow idle"):
        coord._enter(Phase.POST_BACKWARD)  # a gradient lands only once a backward opened
    coord._enter(Phase.PRE_BACKWARD)
    coord._enter(Phase.POST_BACKWARD)
    with pytest.raises(RuntimeError, match="forward cannot follow post_backward"):
        coord._enter(Phase.FORWARD)


def _config(offload: str) -> dict:
    zero = {"stage": 3, "stage3_param_persistence_threshold": 0}
    if offload != "none":
        zero["offload_param"] = {"device": offload, "pin_memory": True}
        zero["offload_optimizer"] = {"device": offload}
    return {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,  # DeepSpeed's default clips at 1.0; plain SGD does not
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
        "zero_optimization": zero,
    }


def state_worker(rank, world, offload):
    import zerostream
    from zerostream.zero.stage3.module_state import runtime_of, state_of

    torch.manual_seed(0)
    model = TinyGPT(checkpoint="reentrant")
    engine, _, _, _ = zerostream.initialize(model=model, config=_config(offload))
    coord = runtime_of(engine.module).coord
    phases = []
    enter = coord._enter

    def watched(phase):
        if not phases or phases[-1] != phase.value:
            phases.append(phase.value)
        enter(phase)

    coord._enter = watched
    xs, ys = make_batches(3, 2 * world)
    losses = []
    for step in range(3):
        sl = slice(2 * rank, 2 * rank + 2)
        loss = engine(xs[step][sl], ys[step][sl])
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    homes = sorted({p._zs.home.value for p in engine.module.parameters()})
    modules = list(engine.module.modules())
    registered = all(
        state_of(m) is not None and state_of(m).original_params is not None for m in modules
    )
    engine.destroy()
    after = {
        "runtime": runtime_of(engine.module),
        "plain_params": all(type(m._parameters) is dict for m in modules),
        "no_private_keys": not any(k.startswith("_zs") for m in modules for k in m.__dict__),
        "phase": coord.phase.value,
    }
    return losses, phases[:12], homes, registered, after


@pytest.mark.multirank
@pytest.mark.parametrize("offload", ["none", "cpu"])
def test_phases_homes_and_registry_of_a_checkpointed_run(offload):
    """Reentrant activation checkpointing: the forward a checkpoint re-runs inside backward
    is a RECOMPUTE (its params are kept for the backward that follows), the losses match
    plain PyTorch, every shard is where offload_param says, and destroy() leaves no
    per-module state behind."""
    results = run_ranks(state_worker, 2, offload, timeout=180)
    torch.manual_seed(0)
    model = TinyGPT(checkpoint="reentrant")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xs, ys = make_batches(3, 4)
    expected = []
    for step in range(3):
        loss = model(xs[step], ys[step])
        loss.backward()
        opt.step()
        opt.zero_grad()
        expected.append(float(loss.detach()))
    mean = [sum(r[0][s] for r in results) / 2 for s in range(3)]
    assert mean == pytest.approx(expected, rel=1e-5)
    for _, phases, homes, registered, after in results:
        # Step 1: forward (no-grad block forwards inside the checkpoints), then backward
        # opens at the head's output gradient, each block is recomputed and its grads land.
        assert phases[:6] == [
            "idle",
            "forward",
            "idle",
            "pre_backward",
            "post_backward",
            "recompute",
        ]
        assert "recompute" in phases and phases.count("forward") == 1
        assert homes == (["host_arena"] if offload == "cpu" else ["device"])
        assert registered
        assert after == {
            "runtime": None,
            "plain_params": True,
            "no_private_keys": True,
            "phase": "idle",
        }


def test_the_phase_is_the_coordinators_own():
    """No part of zerostream asks autograd's private graph-task id which phase runs."""
    import pathlib

    import zerostream

    root = pathlib.Path(zerostream.__file__).parent
    readers = [p for p in root.rglob("*.py") if "_current_graph_task_id" in p.read_text()]
    assert not readers
