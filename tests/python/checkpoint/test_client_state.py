"""A client optimizer whose state holds a step count in a tensor of shape (1,) beside its
elementwise state (DeepSpeed's HybridStateOptimizer checkpoint test), at stages 1 and 2:
saved on 2 ranks and loaded on 2 and on 1 (a re-cut), the count comes back whole on every
rank and training goes on exactly as without the save. Before, the re-cut read the count
as a piece of the partition and refused the files as "not one checkpoint"."""

import pytest
import torch

from mlp import MLP
from multirank import run_ranks

LR = 0.05


class CountingSGD(torch.optim.Optimizer):
    """SGD with momentum whose state also counts its steps, as an int and as a tensor."""

    def __init__(self, params, lr=LR):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["integer_step"] = 0
                    st["tensor_step"] = torch.zeros(1)
                    st["momentum"] = torch.zeros_like(p)
                st["momentum"].mul_(0.9).add_(p.grad)
                p.add_(st["momentum"], alpha=-group["lr"])
                st["integer_step"] += 1
                st["tensor_step"] += 1


def _config(stage):
    return {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_clipping": 0.0,
        "zero_allow_untested_optimizer": True,
        "zero_optimization": {"stage": stage},
    }


def _batch(i):
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(100 + i))


def _steps(engine, rank, world, first, count):
    for i in range(first, first + count):
        x = _batch(i)
        per = x.shape[0] // world
        engine.backward(engine(x[rank * per : (rank + 1) * per]))
        engine.step()


def worker(rank, world, stage, root, phase):
    import zerostream

    torch.manual_seed(0)
    model = MLP()
    engine, *_ = zerostream.initialize(
        model=model, optimizer=CountingSGD(model.parameters()), config=_config(stage)
    )
    if phase == "save":
        _steps(engine, rank, world, 0, 2)
        engine.save_checkpoint(root, tag="t")
        _steps(engine, rank, world, 2, 2)  # the uninterrupted run
    else:
        engine.load_checkpoint(root, tag="t")
        st = engine.optimizer.optimizer.state
        counts = sorted({(int(s["integer_step"]), float(s["tensor_step"])) for s in st.values()})
        _steps(engine, rank, world, 2, 2)
        if rank == 0:
            return counts, [p.detach().clone() for p in engine.module.parameters()]
        return None
    return [p.detach().clone() for p in engine.module.parameters()] if rank == 0 else None


@pytest.mark.multirank
@pytest.mark.parametrize("stage", [1, 2])
def test_a_tensor_step_count_survives_save_and_recut(tmp_path, stage):
    root = str(tmp_path / "ckpt")
    straight = run_ranks(worker, 2, stage, root, "save", timeout=120)[0]
    for world in (2, 1):
        counts, weights = run_ranks(worker, world, stage, root, "load", timeout=120)[0]
        assert counts == [(2, 2.0)], (world, counts)  # whole, as saved
        for a, b in zip(weights, straight):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=f"world {world}")
