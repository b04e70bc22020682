"""offload_param.max_in_cpu "auto" (Note [Parameter shards in host memory], offload/tiers.py):
every shard goes to disk, and once the first step's trace says how often each is read, the
most-read shards that fit the host-memory budget come back into host memory for good.

Checked: the choice by hand; on 2 ranks the budget from ZEROSTREAM_HOST_MEMORY_LIMIT is
respected, no shard left on disk is read more often than one brought back (the tied
embedding, read by two modules, comes back first), the disk reads of later steps fall by at
least the bytes brought back, and the losses are bitwise those of max_in_cpu 0.
"""

import torch

from multirank import run_ranks
from tiny_gpt import TinyGPT, make_batches
from zerostream.offload import tiers

GLOBAL_BATCH = 8


def test_the_most_read_shards_that_fit_are_kept():
    assert tiers.place_shards([2, 1, 1, 3], [10, 10, 10, 10], 25) == [0, 3]
    assert tiers.place_shards([2, 1, 1, 3], [10, 10, 10, 30], 25) == [0, 1]  # 30 never fits
    assert tiers.place_shards([1, 1], [10, 10], 10) == [0]  # a tie keeps the earlier shard
    assert tiers.place_shards([5], [10], 0) == []


def worker(rank, world, root):
    import zerostream

    micro = GLOBAL_BATCH // world
    xs, ys = make_batches(3, GLOBAL_BATCH)
    out = {}
    for max_in_cpu in (0, "auto"):
        torch.manual_seed(0)
        model = TinyGPT()
        config = {
            "train_micro_batch_size_per_gpu": micro,
            "gradient_clipping": 0.0,
            "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
            "zero_optimization": {
                "stage": 3,
                "stage3_param_persistence_threshold": 0,
                "offload_param": {
                    "device": "nvme",
                    "nvme_path": f"{root}/{max_in_cpu}",
                    "max_in_cpu": max_in_cpu,
                },
            },
        }
        engine = zerostream.initialize(model=model, config=config)[0]
        swapper = engine.module.head.weight._zs.partitioner.swapper
        losses, reads = [], []
        for s in range(3):
            before = swapper.bytes_read
            lo = rank * micro
            loss = engine(xs[s][lo : lo + micro], ys[s][lo : lo + micro])
            engine.backward(loss)
            engine.step()
            losses.append(float(loss.detach()))
            reads.append(swapper.bytes_read - before)
        zps = {p._zs.ds_id: p._zs for p in engine.module.parameters()}
        stats = swapper.stats()
        out[max_in_cpu] = {
            "losses": losses,
            "reads": reads,
            "stats": stats,
            "homes": {i: zp.home.value for i, zp in zps.items()},
            "bytes": {i: zp.shard_numel * zp.dtype.itemsize for i, zp in zps.items()},
            "tied": engine.module.head.weight._zs.ds_id,
        }
        engine.destroy()
    return out


def test_auto_brings_the_most_read_shards_back_within_the_budget(tmp_path, monkeypatch):
    # Each of the 2 ranks here gets half of the limit, less 2 GiB and 10%: about 40 KiB.
    share = -(-(2**31 + 40 * 1024) * 10 // 9)
    monkeypatch.setenv("ZEROSTREAM_HOST_MEMORY_LIMIT", str(2 * share))
    for out in run_ranks(worker, 2, str(tmp_path)):
        none, auto = out[0], out["auto"]
        stats = auto["stats"]
        kept, counts = set(stats["kept_ids"]), stats["read_counts"]
        budget = stats["auto_budget_bytes"]
        assert 30 * 1024 < budget < 50 * 1024
        assert kept and len(kept) < len(counts), (kept, counts)
        assert none["stats"]["kept_ids"] == [] and set(none["homes"].values()) == {"nvme"}
        for i in kept:
            assert auto["homes"][i] == "host_arena"
        # Whole pages each, within the budget; nothing on disk is read more than a kept one.
        assert sum(-(-auto["bytes"][i] // 4096) * 4096 for i in kept) <= budget
        left = [counts[i] for i in counts if i not in kept]
        assert max(left) <= min(counts[i] for i in kept)
        assert auto["tied"] in kept and counts[auto["tied"]] == max(counts.values())
        # Later steps read at least the kept shards' bytes less from disk.
        saved = sum(auto["bytes"][i] for i in kept)
        assert none["reads"][2] - auto["reads"][2] >= saved > 0
        assert auto["losses"] == none["losses"]
