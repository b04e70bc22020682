"""Small DeepSpeed names code reads: RepeatingLoader (endless, and a DistributedSampler's
next epoch at each restart, as torch orders it) and the ZeRO optimizer's
`dynamic_loss_scale` / `cur_scale` from the fp16 section."""

import pytest
from torch.utils.data import DataLoader, DistributedSampler

from mlp import MLP


def test_repeating_loader_restarts_and_moves_the_sampler_on():
    from zerostream.data import RepeatingLoader

    loader = RepeatingLoader([1, 2, 3])
    assert [next(loader) for _ in range(7)] == [1, 2, 3, 1, 2, 3, 1]
    data = list(range(10))
    sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=3)
    endless = RepeatingLoader(DataLoader(data, batch_size=10, sampler=sampler))
    first, second = next(endless).tolist(), next(endless).tolist()
    reference = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=3)
    reference.set_epoch(1)
    assert second == list(reference) and sorted(first) == data and first != second


@pytest.mark.parametrize("loss_scale, dynamic", [(0, True), (128, False)])
def test_optimizer_names_its_loss_scaling(loss_scale, dynamic, one_rank_process_group):
    import zerostream

    cfg = {
        "train_batch_size": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
        "fp16": {"enabled": True, "loss_scale": loss_scale, "initial_scale_power": 5},
        "zero_optimization": {"stage": 1},
    }
    engine, optimizer, *_ = zerostream.initialize(model=MLP(), config=cfg)
    assert optimizer.dynamic_loss_scale is dynamic
    assert optimizer.cur_scale == (32.0 if dynamic else 128.0)
    engine.destroy()
