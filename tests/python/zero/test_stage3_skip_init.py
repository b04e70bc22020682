"""ZeRO-3 zero.Init around `torch.nn.utils.skip_init` (modules built on "meta", then
`to_empty`): the params are partitioned without values to copy (zeros, never NaN), keep
their shards through `to_empty`, and train once filled through GatheredParameters."""

import pytest
import torch

from multirank import run_ranks


def worker(rank, world):
    import zerostream

    cfg = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_clipping": 0.0,
        "optimizer": {"type": "SGD", "params": {"lr": 0.001}},
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    }
    with zerostream.zero.Init(config_dict_or_path=cfg):
        model = torch.nn.Sequential(
            torch.nn.utils.skip_init(torch.nn.Linear, 10, 10), torch.nn.Linear(10, 1)
        )
    shard_sizes = [p.ds_tensor.numel() for p in model.parameters()]
    with zerostream.zero.GatheredParameters(list(model[0].parameters()), modifier_rank=0):
        zeros = all(bool((p == 0).all()) for p in model[0].parameters())
        if rank == 0:
            torch.manual_seed(1)
            torch.set_grad_enabled(False)
            model[0].weight.copy_(torch.randn(10, 10))
            model[0].bias.fill_(0.5)
            torch.set_grad_enabled(True)
    engine, *_ = zerostream.initialize(model=model, config=cfg)
    x = torch.ones(2, 10)
    before = float(engine(x).pow(2).mean())
    engine.backward(engine(x).pow(2).mean())
    engine.step()
    after = float(engine(x).pow(2).mean())
    return shard_sizes, zeros, before, after


@pytest.mark.multirank
def test_skip_init_modules_are_partitioned_and_train():
    for shard_sizes, zeros, before, after in run_ranks(worker, 2, timeout=120):
        assert shard_sizes == [50, 5, 5, 1]  # ceil(numel / 2) of 100, 10, 10, 1
        assert zeros
        assert after < before and torch.isfinite(torch.tensor(after))
