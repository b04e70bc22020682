"""Client optimizers (reliability item 14): every torch.optim class a user passes to
initialize() is rebuilt over ZeRO's partitions from its constructor's own arguments (torch's
AdamW records a `decoupled_weight_decay` default its constructor does not take), and trains
like plain PyTorch with the same class. One rank, so stage 1/2 partitions are the whole flat
buffer and elementwise optimizers must agree with per-tensor torch to rounding."""

import pytest
import torch

import zerostream

# Elementwise update rules: the same on a flat partition as on each tensor.
ELEMENTWISE = [
    "ASGD", "Adadelta", "Adagrad", "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop",
    "Rprop", "SGD",
]  # fmt: skip


def _all_torch_optimizers():
    return sorted(
        n
        for n in dir(torch.optim)
        if isinstance(getattr(torch.optim, n), type)
        and issubclass(getattr(torch.optim, n), torch.optim.Optimizer)
        and n != "Optimizer"
    )


def test_the_elementwise_list_covers_every_torch_optimizer_but_the_per_tensor_ones():
    per_tensor = {"Adafactor", "LBFGS", "Muon", "SparseAdam"}  # factored, closure, 2-D, sparse
    assert set(_all_torch_optimizers()) == set(ELEMENTWISE) | per_tensor


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _kwargs(name):
    kw = {"lr": 0.01}
    if name in ("Adam", "AdamW", "SGD", "RMSprop", "Adagrad", "NAdam", "RAdam", "Adamax"):
        kw["weight_decay"] = 0.01
    return kw


pytestmark = pytest.mark.usefixtures("one_rank_process_group")


@pytest.mark.parametrize("stage", [0, 1, 2])
@pytest.mark.parametrize("name", ELEMENTWISE)
def test_client_optimizer_trains_like_plain_torch(name, stage):
    cls = getattr(torch.optim, name)
    data = [torch.randn(4, 8, generator=torch.Generator().manual_seed(i)) for i in range(3)]

    ref = _model()
    ref_opt = cls(ref.parameters(), **_kwargs(name))
    for x in data:
        ref(x).pow(2).mean().backward()
        ref_opt.step()
        ref_opt.zero_grad()

    model = _model()
    cfg = {
        "train_batch_size": 4,
        "zero_allow_untested_optimizer": True,
        "zero_optimization": {"stage": stage},
    }
    engine, opt, *_ = zerostream.initialize(
        model=model, optimizer=cls(model.parameters(), **_kwargs(name)), config=cfg
    )
    for x in data:
        engine.backward(engine(x).pow(2).mean())
        engine.step()
    assert type(engine.basic_optimizer) is cls
    for (n, p), q in zip(engine.module.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6, msg=n)
    engine.destroy()


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_frozen_params_in_the_client_optimizers_groups_stay_as_they_were(stage):
    """A client optimizer built over every param, some frozen (DeepSpeed's zero_to_fp32
    tests, fine-tuning scripts that freeze after building the optimizer): the frozen ones are
    left out of training, as DeepSpeed leaves them, and the rest trains like plain torch."""
    data = [torch.randn(4, 8, generator=torch.Generator().manual_seed(i)) for i in range(3)]

    def frozen_model():
        model = _model()
        model[0].weight.requires_grad_(False)
        return model

    def groups(model):
        return [
            {"params": [model[0].weight, model[2].weight], "weight_decay": 0.01},
            {"params": [model[0].bias, model[2].bias], "weight_decay": 0.0},
        ]

    ref = frozen_model()
    ref_opt = torch.optim.SGD(groups(ref), lr=0.1)
    for x in data:
        ref(x).pow(2).mean().backward()
        ref_opt.step()
        ref_opt.zero_grad()

    model = frozen_model()
    cfg = {
        "train_batch_size": 4,
        "zero_allow_untested_optimizer": True,
        "zero_optimization": {"stage": stage},
    }
    engine, *_ = zerostream.initialize(
        model=model, optimizer=torch.optim.SGD(groups(model), lr=0.1), config=cfg
    )
    for x in data:
        engine.backward(engine(x).pow(2).mean())
        engine.step()
    names = [n for n, _ in ref.named_parameters()]
    got = {n: p for n, p in zip(names, _full_params(engine, stage))}
    for n, q in ref.named_parameters():
        torch.testing.assert_close(got[n], q.detach(), rtol=1e-5, atol=1e-6, msg=n)
    torch.testing.assert_close(got["0.weight"], _model()[0].weight.detach(), rtol=0, atol=0)
    engine.destroy()


def _full_params(engine, stage):
    if stage < 3:
        return [p.detach().clone() for p in engine.module.parameters()]
    out = []
    for p in engine.module.parameters():
        with zerostream.zero.GatheredParameters(p):
            out.append(p.detach().clone())
    return out
