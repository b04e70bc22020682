"""DeepSpeed's per-param calls on ZeRO-3 params, for code that gathers by hand:
`param.all_gather()`, `params[0].all_gather_coalesced(params).wait()` and
`param.partition()`. On 2 ranks each param comes back whole and exact (odd sizes: the last
shard is padded) and goes back to its shard."""

import pytest
import torch

from multirank import run_ranks

NUMELS = (5, 8, 13)  # 13 = 7 + 6 on 2 ranks: the padded tail must not leak in


class Params(torch.nn.Module):
    def __init__(self):
        super().__init__()
        for i, n in enumerate(NUMELS):
            setattr(self, f"p{i}", torch.nn.Parameter(torch.arange(n, dtype=torch.float32)))


def worker(rank, world):
    import zerostream

    cfg = {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    }
    with zerostream.zero.Init(config_dict_or_path=cfg):
        module = Params()
    params = [getattr(module, f"p{i}") for i in range(len(NUMELS))]
    sharded = [p.numel() for p in params]
    params[0].all_gather_coalesced(params).wait()
    gathered = [p.detach().clone() for p in params]
    status = [str(p.ds_status) for p in params]
    params[1].partition(params)
    after = [p.numel() for p in params]
    params[2].all_gather()
    one = params[2].detach().clone()
    params[2].partition()
    return sharded, gathered, status, after, one, params[2].numel()


@pytest.mark.multirank
def test_params_gather_and_partition_by_hand():
    for sharded, gathered, status, after, one, last in run_ranks(worker, 2, timeout=120):
        assert sharded == [0, 0, 0]
        for g, n in zip(gathered, NUMELS):
            assert torch.equal(g, torch.arange(n, dtype=torch.float32))
        assert all("AVAILABLE" in s for s in status), status
        assert after == [0, 0, 0] and last == 0
        assert torch.equal(one, torch.arange(13, dtype=torch.float32))
