"""ZeRO-3: a module that returns one of its own params (a bias its parent adds, DeepSpeed's
"external parameter return", coordinator._hand_up). The param stays gathered for the
enclosing forward, is registered as the outermost user's external parameter (and no
longer the middle module's, which handed it on), and training on 2 ranks equals plain
PyTorch. Before, the child's post-forward hook released it and the parent's addition met an
empty tensor."""

import pytest
import torch

from multirank import run_ranks


class ReturnsBias(torch.nn.Linear):
    def forward(self, x):
        return torch.nn.functional.linear(x, self.weight), self.bias


class PassesItOn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = ReturnsBias(8, 8)
        self.seen = []  # the bias's size where this module uses it

    def forward(self, x):
        out, bias = self.inner(x)
        self.seen.append(bias.numel())
        return torch.tanh(out), bias


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(8, 8)
        self.mid = PassesItOn()
        self.seen = []

    def forward(self, x):
        out, bias = self.mid(self.first(x))
        self.seen.append(bias.numel())
        return (out + bias).pow(2).mean()


def _batch(rank, step):
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(10 * rank + step))


def worker(rank, world):
    import zerostream
    from zerostream.zero.stage3.module_state import external_params

    torch.manual_seed(0)
    cfg = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_clipping": 0.0,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    }
    engine, *_ = zerostream.initialize(model=Outer(), config=cfg)
    model = engine.module
    for step in range(3):
        engine.backward(engine(_batch(rank, step)))
        engine.step()
    with zerostream.zero.GatheredParameters(list(model.parameters())):
        weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    bias = model.mid.inner.bias
    return {
        "weights": weights,
        "seen": (model.mid.seen, model.seen),
        "external": (
            [p is bias for p in external_params(model)],
            len(external_params(model.mid)),
            getattr(bias, "is_external_param", False),
        ),
        "released": bias.numel(),
    }


@pytest.mark.multirank
def test_a_returned_param_is_handed_up_and_training_equals_pytorch():
    results = run_ranks(worker, 2, timeout=120)
    torch.manual_seed(0)
    plain = Outer()
    opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    for step in range(3):
        opt.zero_grad()
        for rank in range(2):
            (plain(_batch(rank, step)) / 2).backward()
        opt.step()
    for r in results:
        for name, p in plain.named_parameters():
            torch.testing.assert_close(r["weights"][name], p.detach(), rtol=1e-5, atol=1e-6)
        assert r["seen"] == ([8, 8, 8], [8, 8, 8])  # whole wherever it is used
        assert r["external"] == ([True], 0, True)  # the outermost user's, not the middle's
        assert r["released"] == 0  # and released after the step like any other
