"""`managed_gradient_accumulation: false` (Note [Who owns the accumulation boundary] in
engine/accumulation.py): the caller runs its backwards and then step(), and every step() is a
boundary.

On 2 ranks, for stages 0-3: gradient_accumulation_steps 4 with 4 backwards per step() ends
bitwise where the managed run (step() after every backward) ends; 2 backwards per step() (the
caller's own boundary) equals plain PyTorch AdamW on the gradients sum(loss_i / 4) averaged
over ranks; the boundary is False in backward and True in step; global_samples counts the
micro-batches run; set_gradient_accumulation_boundary is refused."""

import pytest
import torch

from equal import gathered_weights
from mlp import MLP
from multirank import run_ranks

GAS, MICRO, UPDATES = 4, 2, 2
LR = 1e-2


def _batch(rank: int, i: int) -> torch.Tensor:
    return torch.randn(MICRO, 8, generator=torch.Generator().manual_seed(1000 * rank + i)) * 2


def _config(stage: int, managed: bool) -> dict:
    return {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": GAS,
        "gradient_clipping": 0.0,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.01}},
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 50},
        "managed_gradient_accumulation": managed,
    }


def worker(rank, world, stages):
    import zerostream

    out = {}
    for stage in stages:
        runs = {}
        for name, managed, per_step in (("managed", True, 1), ("unmanaged", False, GAS)):
            torch.manual_seed(0)
            engine, *_ = zerostream.initialize(model=MLP(), config=_config(stage, managed))
            i = 0
            for _ in range(UPDATES * GAS // per_step):
                for _ in range(per_step):
                    engine.backward(engine(_batch(rank, i)))
                    i += 1
                engine.step()
            runs[name] = (gathered_weights(engine), engine.global_steps, engine.global_samples)
            engine.destroy()

        # The caller's own boundary: 2 backwards, then step(), twice.
        torch.manual_seed(0)
        engine, *_ = zerostream.initialize(model=MLP(), config=_config(stage, False))
        seen, i = [], 0
        for _ in range(UPDATES):
            for _ in range(2):
                engine.backward(engine(_batch(rank, i)))
                seen.append(engine.is_gradient_accumulation_boundary())
                i += 1
            engine.step()
        try:
            engine.set_gradient_accumulation_boundary(True)
            refused = ""
        except RuntimeError as exc:
            refused = str(exc)
        runs["short"] = (gathered_weights(engine), engine.global_steps, engine.global_samples)
        runs["boundary_in_backward"] = seen
        runs["refused"] = refused
        engine.destroy()
        out[stage] = runs
    return out if rank == 0 else None


def _plain_short(world: int):
    """Plain PyTorch: per update, gradients of sum over 2 micro-batches of loss / GAS,
    averaged over ranks; torch AdamW."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    i = 0
    for _ in range(UPDATES):
        opt.zero_grad()
        for _ in range(2):
            for rank in range(world):
                (model(_batch(rank, i)) / GAS / world).backward()
            i += 1
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.multirank
def test_every_step_is_the_boundary_when_the_caller_owns_it():
    world, stages = 2, (0, 1, 2, 3)
    results = run_ranks(worker, world, stages, timeout=300)[0]
    plain = _plain_short(world)
    for stage, runs in results.items():
        managed, unmanaged, short = runs["managed"], runs["unmanaged"], runs["short"]
        for a, b in zip(managed[0], unmanaged[0]):
            assert torch.equal(a, b), f"stage {stage}: unmanaged != managed"
        # Both did UPDATES updates over the same UPDATES * GAS micro-batches.
        assert managed[1:] == unmanaged[1:] == (UPDATES, UPDATES * GAS * MICRO * world)
        for a, b in zip(short[0], plain):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"stage {stage}")
        # The short run really updated (not the initial weights) and counted 2 micro-batches.
        assert short[1:] == (UPDATES, UPDATES * 2 * MICRO * world)
        assert runs["boundary_in_backward"] == [False] * (2 * UPDATES)
        assert "managed_gradient_accumulation false" in runs["refused"]


def test_engine_scale_and_a_plain_backward_train_like_engine_backward(one_rank_process_group):
    """DeepSpeed's engine.scale(loss) for a caller that runs loss.backward() itself: the same
    update as engine.backward (no fp16 scale here, and no division by accumulation: one
    micro-batch a step); a loss that is no scalar with grad_fn is refused."""

    import zerostream

    def run(manual):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        cfg = {
            "train_batch_size": 2,
            "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
            "zero_optimization": {"stage": 1},
        }
        engine, *_ = zerostream.initialize(model=model, config=cfg)
        for i in range(3):
            loss = engine(torch.full((2, 4), float(i + 1))).pow(2).mean()
            if manual:
                engine.scale(loss).backward()
            else:
                engine.backward(loss)
            engine.step()
        weight = model.weight.detach().clone()
        with pytest.raises(AssertionError, match="scalar tensor with grad_fn"):
            engine.scale(torch.ones(2, requires_grad=True))
        assert engine.managed_gradient_accumulation() is True and engine.log_level() is None
        engine.destroy()
        return weight

    torch.testing.assert_close(run(True), run(False), rtol=0, atol=0)
