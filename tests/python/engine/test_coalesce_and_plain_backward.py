"""engine.coalesce_grad_reduction() and a plain loss.backward() (Notes [Coalesced reduction]
and [A plain loss.backward()] in zero/base.py), on 2 ranks at stages 0-3.

Coalesced: 4 backwards inside the block and one step() equal plain PyTorch AdamW on the
sum of the 4 micro-batches' gradients averaged over ranks; no gradient collective runs
inside the block (the engine's telemetry counts them), and the block's end issues fewer
than the per-backward reduction does; inside the block param.grad holds this rank's own
sum and safe_get_full_grad answers it; a block that raises drops its gradients without a
collective and training goes on. Plain backward: one loss over two engines'
outputs, `loss.backward()`, step() on each, equals engine.backward on each engine's part,
and the gradient helpers see the gradients after it."""

import pytest
import torch

from equal import gathered_weights, same_tensors
from mlp import MLP
from multirank import run_ranks

CHUNKS, MICRO, LR = 4, 2, 1e-2
STAGES = (0, 1, 2, 3)


def _batch(rank: int, i: int) -> torch.Tensor:
    return torch.randn(MICRO, 8, generator=torch.Generator().manual_seed(1000 * rank + i)) * 2


def _config(stage: int, world: int = 2) -> dict:
    return {
        "train_batch_size": MICRO * world,  # all three batch keys, as DeepSpeed's tests give
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,  # DeepSpeed 0.19's default is 1.0
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.01}},
        # Small buckets: the per-backward path issues several collectives a backward.
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 50},
    }


def _reductions(engine) -> int:
    calls = engine.telemetry.calls
    return calls.get("reduce_scatter", 0) + calls.get("all_reduce", 0)


def _coalesced_step(engine, rank, first, coalesce):
    """CHUNKS backwards and one step; the gradient collectives issued inside the block
    (or during the backwards), and at its end."""
    import contextlib

    from zerostream.utils import safe_get_full_grad

    ctx = engine.coalesce_grad_reduction() if coalesce else contextlib.nullcontext()
    start = _reductions(engine)
    local = None
    with ctx:
        for i in range(CHUNKS):
            engine.set_gradient_accumulation_boundary(i == CHUNKS - 1)
            engine.backward(engine(_batch(rank, first + i)))
        inside = _reductions(engine) - start
        if coalesce:
            p = next(engine.module.parameters())
            local = (p.grad is not None and torch.equal(safe_get_full_grad(p), p.grad), p.grad)
            local = (local[0], None if local[1] is None else local[1].clone())
    at_end = _reductions(engine) - start - inside
    engine.step()
    return inside, at_end, local


def worker(rank, world, stages):
    import zerostream
    from zerostream.engine import NoSyncError

    out = {}
    for stage in stages:
        runs = {}
        for coalesce in (False, True):
            torch.manual_seed(0)
            cfg = _config(stage, world)
            # Stage 3 built under zero.Init, which checks the batch rule against the world.
            with zerostream.zero.Init(config_dict_or_path=cfg, enabled=stage == 3):
                model = MLP()
            engine, *_ = zerostream.initialize(model=model, config=cfg)
            counts = [_coalesced_step(engine, rank, s * CHUNKS, coalesce) for s in range(2)]
            runs[coalesce] = (gathered_weights(engine), [c[:2] for c in counts], counts[0][2])
            if coalesce:
                # A block that raises: no collective, its gradients dropped, training on.
                before = _reductions(engine)
                with pytest.raises(KeyError):
                    with engine.coalesce_grad_reduction():
                        engine.backward(engine(_batch(rank, 99)))
                        raise KeyError("user code")
                runs["raised"] = (
                    _reductions(engine) - before,
                    all(p.grad is None for p in engine.module.parameters()) or stage < 2,
                )
                errors = []
                with engine.coalesce_grad_reduction():
                    try:
                        engine.step()
                    except NoSyncError as exc:
                        errors.append(("step", isinstance(exc, AssertionError), str(exc)))
                    try:
                        with engine.coalesce_grad_reduction():
                            pass
                    except NoSyncError as exc:
                        errors.append(("nested", isinstance(exc, AssertionError), str(exc)))
                runs["errors"] = errors
            engine.destroy()
        out[stage] = runs
    return out if rank == 0 else None


def _plain(world: int, steps: int = 2):
    """Plain PyTorch: per step the sum over CHUNKS micro-batches of each rank's loss,
    averaged over ranks; torch AdamW."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    for s in range(steps):
        opt.zero_grad()
        for i in range(CHUNKS):
            for rank in range(world):
                (model(_batch(rank, s * CHUNKS + i)) / world).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _local_grad_rank0():
    """Rank 0's own gradient of the first param, summed over the first step's micro-batches."""
    torch.manual_seed(0)
    model = MLP()
    for i in range(CHUNKS):
        model(_batch(0, i)).backward()
    return next(model.parameters()).grad


@pytest.mark.multirank
def test_coalesced_reduction_equals_plain_pytorch_with_one_reduction_pass():
    world = 2
    results = run_ranks(worker, world, STAGES, timeout=300)[0]
    plain = _plain(world)
    for stage, runs in results.items():
        for coalesce in (False, True):
            for a, b in zip(runs[coalesce][0], plain):
                torch.testing.assert_close(
                    a, b, rtol=1e-5, atol=1e-6, msg=f"stage {stage} coalesce={coalesce}"
                )
        base_counts, counts = runs[False][1], runs[True][1]
        for (inside, at_end), (base_inside, base_end) in zip(counts, base_counts):
            # Nothing is reduced while the block's backwards run.
            assert inside == 0, f"stage {stage}: {inside} collectives inside the block"
            if stage == 2 or stage == 3:
                # Per-backward reduction: buckets every backward; coalesced: one pass.
                assert base_inside > 0 and base_end == 0
                assert 0 < at_end < base_inside, (stage, at_end, base_inside)
            elif stage == 0:
                # Reduced at the end of the boundary's backward (DeepSpeed's place); inside
                # the block at the step instead.
                assert at_end == 0 and base_inside > 0 and base_end == 0
            else:
                assert at_end == 0 and base_inside == 0  # stage 1 reduces at the step
        same, local = runs[True][2]
        if stage >= 2:
            assert same, f"stage {stage}: safe_get_full_grad is not the local param.grad"
            torch.testing.assert_close(local, _local_grad_rank0(), rtol=1e-5, atol=1e-6)
        assert runs["raised"] == (0, True), f"stage {stage}: {runs['raised']}"
        (step, step_is_assert, step_msg), (nested, nested_is_assert, nested_msg) = runs["errors"]
        assert step_is_assert and "no_sync" in step_msg
        assert nested_is_assert and "nested" in nested_msg


def plain_backward_worker(rank, world, stages):
    import zerostream
    from zerostream.utils import safe_get_full_grad

    out = {}
    for stage in stages:
        runs = {}
        for plain in (False, True):
            engines = []
            for seed in (0, 1):
                torch.manual_seed(seed)
                engines.append(zerostream.initialize(model=MLP(), config=_config(stage))[0])
            grads = []
            for i in range(3):
                x = _batch(rank, i)
                losses = [e(x) for e in engines]
                if plain:
                    (losses[0] + losses[1] / 2).backward()
                else:
                    engines[0].backward(losses[0])
                    engines[1].backward(losses[1] / 2)
                g = safe_get_full_grad(next(engines[1].module.parameters()))
                grads.append(None if g is None else g.clone())
                for e in engines:
                    e._backward_epilogue()  # DeepSpeed < 0.17's call: harmless here
                    e.step()
            runs[plain] = ([gathered_weights(e) for e in engines], grads)
            for e in engines:
                e.destroy()
        out[stage] = runs
    return out if rank == 0 else None


@pytest.mark.multirank
def test_a_plain_loss_backward_over_two_engines_trains_like_engine_backward():
    results = run_ranks(plain_backward_worker, 2, STAGES, timeout=300)[0]
    for stage, runs in results.items():
        (ref_w, ref_g), (got_w, got_g) = runs[False], runs[True]
        for seed, (ref_e, got_e) in enumerate(zip(ref_w, got_w)):
            for a, b in zip(ref_e, got_e):
                torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7, msg=f"stage {stage}")
            torch.manual_seed(seed)  # trained: not the initial weights
            assert any(not torch.equal(a, b.detach()) for a, b in zip(ref_e, MLP().parameters()))
        for a, b in zip(ref_g, got_g):
            assert a is not None and b is not None, f"stage {stage}: no gradient held"
            torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7, msg=f"stage {stage}")


class _ReentrantTail(torch.nn.Module):
    """A layer, then the rest inside one reentrant checkpoint: a plain backward's first
    gradient hook fires in the recompute's own (inner) autograd run, whose end runs the
    queued epilogue before the outer backward reaches `pre`; `pre`'s hook queues another."""

    def __init__(self):
        super().__init__()
        self.pre = torch.nn.Linear(8, 8)
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)

    def _inner(self, x):
        return self.b(torch.relu(self.a(x)))

    def forward(self, x):
        h = torch.tanh(self.pre(x))
        return torch.utils.checkpoint.checkpoint(self._inner, h, use_reentrant=True).pow(2).mean()


def reentrant_worker(rank, world):
    import zerostream

    out = {}
    for stage in (0, 1, 2, 3):
        for plain in (False, True):
            torch.manual_seed(0)
            cfg = _config(stage)
            engine = zerostream.initialize(model=_ReentrantTail(), config=cfg)[0]
            for i in range(3):
                gen = torch.Generator().manual_seed(100 * rank + i)
                x = torch.randn(MICRO, 8, generator=gen, requires_grad=True)
                loss = engine(x)
                if plain:
                    loss.backward()
                else:
                    engine.backward(loss)
                engine.step()
            out[(stage, plain)] = gathered_weights(engine)
            engine.destroy()
    return out


@pytest.mark.multirank
def test_a_plain_backward_through_a_reentrant_checkpoint_equals_engine_backward():
    for out in run_ranks(reentrant_worker, 2):
        for stage in (0, 1, 2, 3):
            assert same_tensors(out[(stage, False)], out[(stage, True)]), stage
