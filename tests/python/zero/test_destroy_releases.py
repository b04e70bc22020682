"""engine.destroy() while the caller keeps the model (the usual case: RLHF loops and
notebooks build engine after engine around one model) releases the optimizer and its host
memory. Stage 3's optimizer listened to the partitioner that the model's params keep, and
through that listener stayed alive with its page-locked arenas for as long as the model did.
"""

import gc
import weakref

import torch

from multirank import run_ranks
from tiny_gpt import TinyGPT

CASES = [
    (1, {"offload_optimizer": {"device": "cpu"}}),
    (2, {"offload_optimizer": {"device": "nvme"}}),
    (3, {"offload_optimizer": {"device": "cpu"}}),
    (3, {"offload_optimizer": {"device": "cpu", "ratio": 0.5}, "sub_group_size": 2000}),
    (3, {"offload_optimizer": {"device": "nvme"}, "offload_param": {"device": "nvme"}}),
]


def worker(rank, world, root):
    import zerostream
    from zerostream.offload.host_buffers import arena_totals

    out = []
    model = TinyGPT()  # kept by the caller across every engine
    for i, (stage, zero) in enumerate(CASES):
        for section in ("offload_optimizer", "offload_param"):
            if section in zero and zero[section]["device"] == "nvme":
                zero[section]["nvme_path"] = f"{root}/{i}"
        cfg = {
            "train_micro_batch_size_per_gpu": 2,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
            "zero_optimization": {"stage": stage, **zero},
        }
        before = arena_totals()["in_use"]
        engine = zerostream.initialize(model=model, config=cfg)[0]
        x = torch.randint(0, 64, (2, 16))
        engine.backward(engine(x, x))
        engine.step()
        held = arena_totals()["in_use"]
        alive = weakref.ref(engine.optimizer)
        engine.destroy()
        del engine
        gc.collect()
        out.append((alive() is None, before, held, arena_totals()["in_use"]))
        model = TinyGPT()  # kept through destroy() and the collection; the next engine's
    return out


def test_destroy_releases_the_optimizer_and_its_host_memory_while_the_model_lives(tmp_path):
    for (stage, zero), (gone, before, held, after) in zip(
        CASES, run_ranks(worker, 1, str(tmp_path))[0]
    ):
        assert gone, f"stage {stage} {zero}: the optimizer outlived destroy()"
        assert held > before, (stage, zero)  # the run did hold host arenas
        if "offload_param" not in zero:  # (offloaded params keep their shards' memory)
            assert after == before, (stage, zero, before, held, after)
