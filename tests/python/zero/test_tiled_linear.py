"""TiledLinear (deepspeed.zero.TiledLinear): a linear layer as a grid of tiles, each its own
module, so ZeRO-3 gathers one tile's weights at a time. Checked against torch.nn.Linear
(forward, gradients per tile, training at stage 3 on 2 ranks) and for the mechanism (while
a tile runs, the other tiles' weights are released)."""

import copy

import pytest
import torch
import torch.nn as nn

from multirank import run_ranks
from zerostream.zero import TiledLinear, TiledLinearReturnBias
from zerostream.zero.stage3.tiling import uniform_cuts


def test_cuts_are_deepspeeds_uniform_partition():
    assert uniform_cuts(32, 5) == [0, 7, 14, 20, 26, 32]  # the first blocks one wider
    assert uniform_cuts(40, 4) == [0, 10, 20, 30, 40]
    assert uniform_cuts(3, 5) == [0, 1, 2, 3, 3, 3]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("in_splits,out_splits", [(1, 1), (2, 3), (5, 5)])
@pytest.mark.parametrize("in_f,out_f", [(32, 32), (23, 29)])
def test_forward_and_gradients_equal_one_linear(bias, in_splits, out_splits, in_f, out_f):
    torch.manual_seed(0)
    base = nn.Linear(in_f, out_f, bias=bias).double()
    tiled = TiledLinear(in_f, out_f, bias=bias, in_splits=in_splits, out_splits=out_splits,
                        init_linear=copy.deepcopy(base)).double()  # fmt: skip
    x = torch.randn(3, 4, in_f, dtype=torch.float64)
    want, got = base(x), tiled(x)
    torch.testing.assert_close(got, want)
    want.square().sum().backward()
    got.square().sum().backward()
    for r in range(out_splits):
        r0, r1 = tiled.out_parts[r], tiled.out_parts[r + 1]
        for c in range(in_splits):
            c0, c1 = tiled.in_parts[c], tiled.in_parts[c + 1]
            tile = tiled.linears[r][c]
            torch.testing.assert_close(tile.weight.grad, base.weight.grad[r0:r1, c0:c1])
            assert (tile.bias is not None) == (bias and c == in_splits - 1)
            if tile.bias is not None:
                torch.testing.assert_close(tile.bias.grad, base.bias.grad[r0:r1])


def test_split_input_and_uncombined_output():
    torch.manual_seed(0)
    base = nn.Linear(10, 6).double()
    tiled = TiledLinear(10, 6, in_splits=2, out_splits=2, input_is_already_split=True,
                        combine_out_splits=False, init_linear=base).double()  # fmt: skip
    x = torch.randn(2, 10, dtype=torch.float64)
    outs = tiled(list(torch.split(x, [5, 5], dim=-1)))
    torch.testing.assert_close(torch.cat(outs, -1), base(x))
    with pytest.raises(ValueError, match="3 pieces, in_splits is 2"):
        tiled(list(torch.split(x, [4, 3, 3], dim=-1)))


class ReturnsBias(nn.Linear):
    """Megatron-LM's linear layers return their bias for a later fused addition."""

    def forward(self, x):
        return nn.functional.linear(x, self.weight), self.bias


@pytest.mark.parametrize("bias", [False, True])
def test_return_bias_tiles(bias):
    torch.manual_seed(0)
    base = ReturnsBias(12, 9, bias=bias).double()
    tiled = TiledLinearReturnBias(12, 9, bias=bias, in_splits=3, out_splits=2,
                                  linear_cls=ReturnsBias, init_linear=base).double()  # fmt: skip
    x = torch.randn(5, 12, dtype=torch.float64)
    (want, want_b), (got, got_b) = base(x), tiled(x)
    torch.testing.assert_close(got, want)
    if bias:
        torch.testing.assert_close(got_b, want_b)
    else:
        assert got_b is None


@pytest.mark.parametrize("splits", [(0, 1), (1, 0), (33, 1), (1, 33)])
def test_splits_out_of_range_name_the_argument(splits):
    name = "in_splits" if splits[0] not in (1,) else "out_splits"
    with pytest.raises(RuntimeError, match=name):
        TiledLinear(32, 32, in_splits=splits[0], out_splits=splits[1])


def test_copy_params_from_checks_the_shape():
    tiled = TiledLinear(8, 4, in_splits=2)
    with pytest.raises(ValueError, match=r"shape \(4, 8\)"):
        tiled.copy_params_from(nn.Linear(4, 8))
    with pytest.raises(ValueError, match="bias=True"):
        tiled.copy_params_from(nn.Linear(8, 4, bias=False))


class Net(nn.Module):
    def __init__(self, tiled: bool):
        super().__init__()
        torch.manual_seed(3)
        self.inp = nn.Linear(16, 48)
        big = nn.Linear(48, 40)
        self.out = nn.Linear(40, 1)
        # The tiles' own initialisation draws last; their values are then big's.
        self.big = TiledLinear(48, 40, in_splits=3, out_splits=2, init_linear=big) if tiled else big

    def forward(self, x):
        return self.out(torch.tanh(self.big(torch.tanh(self.inp(x))))).square().mean()


def stage3_worker(rank, world):
    import zerostream
    from zerostream.zero import Init, ZeroParamStatus

    config = {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}},
        "zero_optimization": {
            "stage": 3,
            "stage3_param_persistence_threshold": 0,
            "stage3_prefetch_bucket_size": 0,
            "stage3_max_reuse_distance": 0,
        },
    }
    with Init(config_dict_or_path=config):
        model = Net(tiled=True)
    tiles = [t for row in model.big.linears for t in row]
    seen = []

    def check(module, _):  # while a tile runs, which other tiles' weights are whole
        # Read past the watched _parameters: a read through it (or t.weight) during a
        # forward fetches the param, as a use outside its module.
        whole = [
            dict.__getitem__(t._parameters, "weight").ds_status != ZeroParamStatus.NOT_AVAILABLE
            for t in tiles
        ]
        seen.append((tiles.index(module), whole))

    for t in tiles:
        t.register_forward_pre_hook(check)
    engine, _, _, _ = zerostream.initialize(model=model, config=config,
                                            model_parameters=model.parameters())  # fmt: skip
    gen = torch.Generator().manual_seed(11)
    data = [torch.randn(2 * world, 16, generator=gen) for _ in range(4)]
    losses = []
    for x in data:
        loss = engine(x[2 * rank : 2 * rank + 2])
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    shards = {n: p.ds_tensor.numel() for n, p in model.named_parameters() if "big" in n}
    return losses, seen, shards, tiles[0].weight.ds_numel


def reference(world):
    model = Net(tiled=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    gen = torch.Generator().manual_seed(11)
    data = [torch.randn(2 * world, 16, generator=gen) for _ in range(4)]
    out = []
    for x in data:
        opt.zero_grad()
        losses = [model(x[2 * r : 2 * r + 2]) for r in range(world)]
        sum(losses).div(world).backward()
        opt.step()
        out.append([loss.item() for loss in losses])
    return out


@pytest.mark.multirank
def test_stage3_trains_like_one_linear_gathering_one_tile_at_a_time():
    world = 2
    results = run_ranks(stage3_worker, world, timeout=180)
    want = reference(world)
    for rank, (losses, seen, shards, tile_numel) in enumerate(results):
        for step, loss in enumerate(losses):
            assert loss == pytest.approx(want[step][rank], rel=1e-5, abs=1e-7)
        # Each tile is a module of its own: partitioned (each rank holds half), and when a
        # tile's forward starts (this hook runs before its gather) at most the tile just
        # before it is still whole (the traced steps release it at the next event), never
        # the layer: the first, untraced step has none whole.
        assert tile_numel == 20 * 16 and shards["big.linears.0.0.weight"] == 160
        assert len(seen) == 6 * 4
        for n, (idx, whole) in enumerate(seen):
            assert whole == [n >= 6 and i == idx - 1 for i in range(6)], (n, idx, whole)
