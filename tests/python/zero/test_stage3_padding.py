"""Stage 3 cuts a parameter of n elements into world shards of ceil(n / world): the last
rank's shard ends in padding. The reduce-scatter's send buffer must carry zeros there (only
that padding is cleared, not the whole bucket), or the padding's "gradients" enter the
global norm and the clipping. Checked on 2 ranks with odd-sized parameters: the norm the
engine reports is plain PyTorch's on the same global batch, and every padding element of
every rank's gradient partition is zero."""

import torch

from multirank import run_ranks


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))


def _batch():
    gen = torch.Generator().manual_seed(1)
    return torch.randn(4, 5, generator=gen), torch.randn(4, 1, generator=gen)


def padding_worker(rank, world):
    import zerostream

    cfg = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_clipping": 1e6,  # the norm is computed; nothing is clipped
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        # reduce_bucket_size large: every gradient in one bucket; persistence 0: every
        # parameter sharded
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    }
    engine, *_ = zerostream.initialize(model=_model(), config=cfg)
    x, y = _batch()
    mine = slice(2 * rank, 2 * rank + 2)
    loss = torch.nn.functional.mse_loss(engine(x[mine]), y[mine])
    engine.backward(loss)
    opt = engine.optimizer
    opt.reducer.flush()  # the gradients land now (step() would land them first)
    opt.reducer.drain()
    padding, padded = [], 0
    for zps in opt.groups:
        for zp in zps:
            group, at = opt.slots[zp.ds_id]
            real = max(0, min(zp.shard_numel, zp.numel - rank * zp.shard_numel))
            pad = opt.grad_read(group, at + real, zp.shard_numel - real)
            padding.append(pad.float().abs().sum().item())
            padded += pad.numel()
    engine.step()
    return {"norm": float(engine.get_global_grad_norm()), "padding": padding, "padded": padded}


def test_padding_carries_no_gradient_into_the_norm():
    ranks = run_ranks(padding_worker, 2, timeout=120)
    model = _model()
    x, y = _batch()
    # Each rank's loss is the mean over its 2 samples; the engine averages over ranks.
    loss = sum(torch.nn.functional.mse_loss(model(x[i : i + 2]), y[i : i + 2]) for i in (0, 2))
    (loss / 2).backward()
    want = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters())).item()
    for out in ranks:
        assert sum(out["padding"]) == 0.0, out["padding"]
        assert abs(out["norm"] - want) <= 1e-6 * max(1.0, want), (out["norm"], want)
    # 15, 3, 3 and 1 elements: rank 1's shards of the first three and rank 1's of the last
    # (shard 1 of 1 element) are padding
    assert [out["padded"] for out in ranks] == [0, 4]
