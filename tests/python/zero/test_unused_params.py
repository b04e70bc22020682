"""A parameter that gets no gradient on some ranks (a data-dependent branch: an auxiliary
head used on some batches, an expert no token of this rank routes to).

Every stage must train as plain PyTorch does when it averages the ranks' gradients with a
missing one counted as zero (shared/TESTING.md, "Ranks that differ"); before, stages 0, 2
and 3 aborted on Gloo (the ranks reduced different sizes: Note [Buckets in one order on
every rank]) and would hang on NCCL. run_ranks checks that the ranks issued the same
collectives. With zero_optimization.ignore_unused_parameters false (stages 1 and 2),
DeepSpeed's error names the parameters, and it is raised on every rank, not only on the one
that lacks the gradient while the others wait in the next collective.
"""

import pytest
import torch

from multirank import run_ranks

STEPS, WORLD, LR = 3, 2, 1e-2


class Branchy(torch.nn.Module):
    """`a` runs on every rank; `b` only where `use_b` (rank 0's batches), between `a` and
    `c`; `c` after both."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 16)
        self.c = torch.nn.Linear(16, 4)

    def forward(self, x, use_b):
        h = torch.tanh(self.a(x))
        if use_b:
            h = h + torch.tanh(self.b(h))
        return self.c(h).pow(2).mean()


def _batch(rank: int, step: int) -> torch.Tensor:
    return torch.randn(2, 8, generator=torch.Generator().manual_seed(100 * step + rank))


def _config(stage: int, offload: str, ignore: bool = True) -> dict:
    zero = {
        "stage": stage,
        "reduce_bucket_size": 200,  # a few buckets: the missing one shifts nothing
        "stage3_param_persistence_threshold": 0,
        "ignore_unused_parameters": ignore,
    }
    if offload != "none":
        zero["offload_optimizer"] = {"device": offload}
    return {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_clipping": 0.0,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.01}},
        "zero_optimization": zero,
    }


CASES = [(0, "none"), (1, "none"), (1, "cpu"), (2, "none"), (2, "cpu"), (3, "none"), (3, "cpu")]


def reference():
    """Plain PyTorch: the mean over ranks of each rank's loss (rank 1's without `b`), so a
    gradient missing on a rank counts as zero; torch AdamW."""
    torch.manual_seed(0)
    model = Branchy()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    for s in range(STEPS):
        opt.zero_grad()
        loss = sum(model(_batch(r, s), r == 0) for r in range(WORLD)) / WORLD
        loss.backward()
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def worker(rank, world, cases):
    import zerostream
    from zerostream.zero import GatheredParameters

    out = {}
    for stage, offload in cases:
        torch.manual_seed(0)
        engine = zerostream.initialize(model=Branchy(), config=_config(stage, offload))[0]
        for s in range(STEPS):
            loss = engine(_batch(rank, s), rank == 0)
            engine.backward(loss)
            engine.step()
        with GatheredParameters(list(engine.module.parameters())):
            out[(stage, offload)] = {
                n: p.detach().clone() for n, p in engine.module.named_parameters()
            }
        engine.destroy()
    return out


@pytest.mark.multirank
@pytest.mark.timeout(300)
def test_a_param_unused_on_one_rank_trains_like_plain_pytorch():
    ref = reference()
    for rank_out in run_ranks(worker, WORLD, CASES, timeout=240):
        for case, params in rank_out.items():
            for name, want in ref.items():
                torch.testing.assert_close(params[name], want, rtol=1e-5, atol=1e-6, msg=str(case))


def strict_worker(rank, world, stage):
    import zerostream
    from zerostream.zero.stage12 import UnusedParametersError

    torch.manual_seed(0)
    engine = zerostream.initialize(model=Branchy(), config=_config(stage, "none", False))[0]
    try:
        engine.backward(engine(_batch(rank, 0), rank == 0))
        engine.step()
    except UnusedParametersError as exc:
        return str(exc)
    finally:
        engine.destroy()
    return "trained"


@pytest.mark.multirank
@pytest.mark.parametrize("stage", [1, 2])
def test_ignore_unused_parameters_false_raises_on_every_rank(stage):
    said = run_ranks(strict_worker, WORLD, stage, timeout=60)
    for message in said:
        assert "ignore_unused_parameters" in message, said
        # b's weight and bias, missing on rank 1 (the highest rank that lacks them)
        assert "2 trainable parameter(s)" in message and "(rank 1)" in message, message
    assert said[0] == said[1]
