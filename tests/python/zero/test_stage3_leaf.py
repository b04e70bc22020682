"""ZeRO-3 leaf modules (Note [Leaf modules] in zero/stage3/leaf.py) on 2 Gloo ranks: a
mixture-of-experts block whose tokens route to different experts on each rank trains under
stage 3 once the block is a leaf, marked by the config's `zero_optimization.leaf_module` or
by `set_z3_leaf_modules`, with the losses and weights of plain PyTorch data parallelism;
the block is gathered whole (unused experts included) and its experts get no hooks. Without
the leaf it trains right too, each expert gathered in the rounds the ranks agree on."""

import pytest
import torch
import torch.nn as nn

from multirank import run_ranks

STEPS = 3


class Experts(nn.Module):
    """Routes the whole batch to one expert, chosen by its mean's sign: each rank's data
    here picks another expert, so per-expert gathers would differ between ranks."""

    def __init__(self):
        super().__init__()
        self.experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        self.seen_numel = []  # numel of every expert weight while the block runs

    def forward(self, x):
        self.seen_numel.append([e.weight.numel() for e in self.experts])
        return self.experts[0 if x.mean() > 0 else 1](x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 8)
        self.moe = Experts()
        self.out = nn.Linear(8, 2)

    def forward(self, x, y):
        return nn.functional.cross_entropy(self.out(torch.tanh(self.moe(self.inp(x)))), y)


def batch(step, rank):
    g = torch.Generator().manual_seed(100 * step + rank)
    x = torch.rand(4, 8, generator=g) + 0.5
    # inp is initialised so that rank 0's activations stay positive, rank 1's negative.
    return (x if rank == 0 else -x), torch.randint(0, 2, (4,), generator=g)


def make_net():
    torch.manual_seed(0)
    net = Net()
    with torch.no_grad():
        net.inp.weight.copy_(torch.eye(8))
        net.inp.bias.zero_()
    return net


def config(leaf_module=None):
    zero = {
        "stage": 3,
        "stage3_param_persistence_threshold": 0,
        "stage3_prefetch_bucket_size": 0,
        "stage3_max_reuse_distance": 0,
    }
    if leaf_module is not None:
        zero["leaf_module"] = leaf_module
    return {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_clipping": 0.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}},
        "zero_optimization": zero,
    }


def _train(engine, net, rank):
    """(losses, the whole weights) after STEPS steps of `engine` on this rank's batches."""
    from zerostream.zero import GatheredParameters

    losses = []
    for step in range(STEPS):
        loss = engine(*batch(step, rank))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    weights = {}
    for name, p in net.named_parameters():
        with GatheredParameters(p):
            weights[name] = p.detach().clone()
    return losses, weights


def worker(rank, world, how):
    import zerostream
    from zerostream.zero.stage3 import leaf

    net = make_net()
    if how == "api":
        leaf.mark_by_class(net, [Experts])
        cfg = config()
    else:
        cfg = config({"classes": "Experts"} if how == "class" else {"name_suffixes": ["moe"]})
    engine, *_ = zerostream.initialize(model=net, config=cfg)
    from zerostream.zero.stage3.module_state import runtime_of

    hooked = {id(m) for m in runtime_of(net).hooked}
    losses, weights = _train(engine, net, rank)
    return {
        "losses": losses,
        "weights": weights,
        "seen": net.moe.seen_numel,
        "released": [e.weight.numel() for e in net.moe.experts],
        "experts_hooked": any(id(m) in hooked for m in net.moe.modules() if m is not net.moe),
        "moe_hooked": id(net.moe) in hooked,
    }


def reference():
    """Plain PyTorch, both ranks' batches: data parallelism averages their gradients."""
    net = make_net()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.0)
    losses = []
    for step in range(STEPS):
        per_rank = [net(*batch(step, r)) for r in range(2)]
        opt.zero_grad()
        ((per_rank[0] + per_rank[1]) / 2).backward()
        opt.step()
        losses.append([loss.item() for loss in per_rank])
    return losses, {n: p.detach() for n, p in net.named_parameters()}


@pytest.mark.multirank
@pytest.mark.parametrize("how", ["class", "suffix", "api"])
def test_a_leaf_moe_block_trains_like_data_parallel_torch(how):
    results = run_ranks(worker, 2, how, timeout=180)
    ref_losses, ref_weights = reference()
    for rank, r in enumerate(results):
        assert r["losses"] == pytest.approx([step[rank] for step in ref_losses], rel=1e-5)
        for name, w in ref_weights.items():
            torch.testing.assert_close(r["weights"][name], w, rtol=1e-5, atol=1e-6, msg=name)
        # Gathered whole while it runs, the expert this rank does not use included; released
        # after; its experts carry no hooks of their own.
        assert all(seen == [64, 64, 64] for seen in r["seen"]), r["seen"]
        assert r["released"] == [0, 0, 0]
        assert r["moe_hooked"] and not r["experts_hooked"]


def unmarked_worker(rank, world):
    import zerostream

    net = make_net()
    engine, *_ = zerostream.initialize(model=net, config=config({"classes": []}))
    losses, weights = _train(engine, net, rank)
    return {
        "losses": losses,
        "weights": weights,
        "trace": engine.optimizer.state_summary()["trace"],
    }


@pytest.mark.multirank
def test_without_the_leaf_the_experts_train_like_data_parallel_torch():
    """Each expert gathered on its own: each rank runs another expert, yet the ranks issue
    the same gathers (Note [One gather sequence on every rank]; run_ranks compares the
    collectives): the expert a rank does not run is gathered there too, in the rounds the
    other rank asks for. Before, the ranks aborted (and would hang on NCCL)."""
    results = run_ranks(unmarked_worker, 2, timeout=120)
    ref_losses, ref_weights = reference()
    for rank, r in enumerate(results):
        assert r["losses"] == pytest.approx([step[rank] for step in ref_losses], rel=1e-5)
        for name, w in ref_weights.items():
            torch.testing.assert_close(r["weights"][name], w, rtol=1e-5, atol=1e-6, msg=name)
        # The experts' gathers came from rounds: no rank's trace holds the other's expert
        # where it runs its own, so replays left the trace (on both ranks alike).
        assert r["trace"]["rounds"] > 0, r["trace"]
    agreed = ("rounds", "invalidations", "trace_recordings", "prefetched_numel")
    assert [{k: r["trace"][k] for k in agreed} for r in results] == [
        {k: results[0]["trace"][k] for k in agreed}
    ] * 2


def test_the_leaf_section_is_checked_by_key():
    from zerostream.zero.stage3 import leaf

    assert leaf.leaf_config({}).classes == list(leaf.DEFAULT_CLASSES)
    c = leaf.leaf_config({"classes": "A", "names": ["b", "b"], "name_suffixes": "c"})
    assert (c.classes, c.names, c.name_suffixes) == (["A"], ["b"], ["c"])
    with pytest.raises(ValueError, match=r"zero_optimization\.leaf_module\.clases: unknown key"):
        leaf.leaf_config({"clases": ["A"]})
    with pytest.raises(ValueError, match=r"leaf_module\.names: expected a string or a list"):
        leaf.leaf_config({"names": [1]})


def test_marking_by_class_name_and_suffix():
    from zerostream.zero.stage3 import leaf

    net = make_net()
    qualified = f"{Experts.__module__}.{Experts.__qualname__}"
    assert leaf.mark_by_class(net, [qualified]) == [net.moe]
    assert leaf.is_leaf(net.moe) and not leaf.is_leaf(net)
    assert [type(m).__name__ for m in leaf.hooked_modules(net)] == [
        "Net",
        "Linear",
        "Experts",
        "Linear",
    ]
    assert leaf.mark_by_class(net, ["Experts"], flag=False) == [net.moe]
    assert not leaf.is_leaf(net.moe)
    net.moe.tied = net.inp  # one module under two parents: hooked once, as modules() lists it
    assert list(leaf.hooked_modules(net)) == list(net.modules())
    assert leaf.mark_by_name(net, ["moe.experts"], suffix=True) == ([net.moe.experts], [])
    assert leaf.mark_by_name(net, ["nope"], raise_if_not_found=False) == ([], ["nope"])
    with pytest.raises(ValueError, match="no module of the classes"):
        leaf.mark_by_class(net, [nn.Conv2d])
