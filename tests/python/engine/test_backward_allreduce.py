"""`engine.enable_backward_allreduce` and `engine.allreduce_gradients()` (DeepSpeed's): at
ZeRO stage 0 a caller may take the gradient reduction over (gradient-compression research
code sets the flag False and reduces in its own hooks), or run it before the step.

On 2 ranks, against the default run and plain PyTorch:
- False and nothing reduced: each rank steps on its own gradients, exactly what plain
  PyTorch AdamW does on that rank's micro-batches alone (the ranks' weights diverge);
- False with the caller's own all-reduce sum in place of the engine's average: the update
  sees the sum (and with allreduce_gradients() instead, the default run's average);
- True with allreduce_gradients() before step(): bitwise the default run, also with
  gradient_allreduce_op "sum", where a second reduction would double every gradient;
- stages 1-3: allreduce_gradients() changes nothing; False is refused by name.
"""

import pytest
import torch

from equal import gathered_weights, same_tensors
from mlp import MLP
from multirank import run_ranks

STEPS, MICRO, LR = 3, 2, 1e-2


def _batch(rank: int, i: int) -> torch.Tensor:
    return torch.randn(MICRO, 8, generator=torch.Generator().manual_seed(1000 * rank + i)) * 2


def _config(stage: int, op: str = "mean") -> dict:
    return {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_clipping": 0.0,
        "gradient_allreduce_op": op,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.01}},
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 50},
    }


def _run(rank, stage, op="mean", flag=True, explicit=False, own_sum=False):
    import torch.distributed as dist

    import zerostream

    torch.manual_seed(0)
    engine, *_ = zerostream.initialize(model=MLP(), config=_config(stage, op))
    engine.enable_backward_allreduce = flag
    for i in range(STEPS):
        engine.backward(engine(_batch(rank, i)))
        if own_sum:
            for p in engine.module.parameters():
                dist.all_reduce(p.grad)
        if explicit:
            engine.allreduce_gradients()
        engine.step()
    weights = gathered_weights(engine)
    engine.destroy()
    return weights


def worker(rank, world):
    out = {
        "default": _run(rank, 0),
        "local": _run(rank, 0, flag=False),
        "own_sum": _run(rank, 0, flag=False, own_sum=True),
        "sum_op": _run(rank, 0, op="sum"),
        "false_explicit": _run(rank, 0, flag=False, explicit=True),
        "true_explicit": _run(rank, 0, explicit=True),
        "sum_op_explicit": _run(rank, 0, op="sum", explicit=True),
    }
    for stage in (1, 2, 3):
        out[("plain", stage)] = _run(rank, stage)
        out[("explicit", stage)] = _run(rank, stage, explicit=True)
        try:
            _run(rank, stage, flag=False)
            out[("refused", stage)] = None
        except NotImplementedError as exc:
            out[("refused", stage)] = str(exc)
    return out


def _plain_adamw(batches):
    """Plain PyTorch: MLP from seed 0, AdamW, one step per entry of `batches` on the mean
    loss of the micro-batches listed there."""
    torch.manual_seed(0)
    model = MLP()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    for xs in batches:
        (sum(model(x) for x in xs) / len(xs)).backward()
        opt.step()
        opt.zero_grad()
    return [p.detach() for p in model.parameters()]


def _close(a, b) -> None:
    assert len(a) == len(b) > 0
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


@pytest.mark.multirank
def test_backward_allreduce_switch_and_explicit_reduction():
    ranks = run_ranks(worker, 2)
    for rank, out in enumerate(ranks):
        # Nothing reduced: this rank's own micro-batches, as plain PyTorch alone on them.
        _close(out["local"], _plain_adamw([[_batch(rank, i)] for i in range(STEPS)]))
        # The caller's sum replaces the engine's mean: the "sum" op's update.
        _close(out["own_sum"], out["sum_op"])
        # Explicit reductions are the engine's own, once.
        assert same_tensors(out["false_explicit"], out["default"])
        assert same_tensors(out["true_explicit"], out["default"])
        assert same_tensors(out["sum_op_explicit"], out["sum_op"])
        for stage in (1, 2, 3):
            assert same_tensors(out[("explicit", stage)], out[("plain", stage)]), stage
            message = out[("refused", stage)]
            assert (
                message and "enable_backward_allreduce" in message and f"stage {stage}" in message
            )
    # The default run averages over both ranks: plain PyTorch on the mean of the two losses.
    both = [[_batch(r, i) for r in range(2)] for i in range(STEPS)]
    _close(ranks[0]["default"], _plain_adamw(both))
    assert not same_tensors(ranks[0]["local"], ranks[1]["local"])  # unreduced ranks diverge
    assert same_tensors(ranks[0]["default"], ranks[1]["default"])
