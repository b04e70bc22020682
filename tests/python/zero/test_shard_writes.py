"""Stage-3 shard writes in flight (Note [Shard writes beside the forward's reads] in
zero/stage3/shard_writes.py): an update's shard writes are asynchronous, at most
WRITES_IN_FLIGHT at once, and no shard is read while its own write may be in flight (not yet
waited for), in a serial step's next forward as behind an overlapped one. Training matches
the run with every shard in host memory bit for bit."""

import pytest
import torch

from multirank import run_ranks
from tiny_gpt import TinyGPT, make_batches

STEPS = 3


def _train(rank, world, root, params, overlap):
    import zerostream
    from zerostream.sizing import PARAM_WRITES_IN_FLIGHT

    xs, ys = make_batches(STEPS, 4)
    torch.manual_seed(0)
    zero = {
        "stage": 3,
        "offload_optimizer": {"device": "cpu"},
        "offload_param": {"device": params, "nvme_path": root, "max_in_cpu": 0},
        "stage3_param_persistence_threshold": 100,
    }
    cfg = {
        "train_micro_batch_size_per_gpu": 4,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
        "zero_optimization": zero,
        "bf16": {"enabled": True},
    }
    if overlap:
        cfg["zerostream"] = {"overlap_step": "next_forward"}
    engine = zerostream.initialize(model=TinyGPT(), config=cfg)[0]
    swapper = engine.optimizer.part.swapper
    seen = {"reads": 0, "while_writing": 0, "most_in_flight": 0}
    if swapper is not None:
        store_read, store_write = swapper.store.read, swapper.store.write
        last_write = {}  # tensor id -> its last write's ticket

        def read(tensor_id, tensor):
            seen["reads"] += 1
            ticket = last_write.get(tensor_id)
            seen["while_writing"] += any(t is ticket for t in swapper.shard_writes.in_flight())
            return store_read(tensor_id, tensor)

        def write(tensor_id, tensor):
            in_flight = len(swapper.shard_writes.in_flight()) + 1
            seen["most_in_flight"] = max(seen["most_in_flight"], in_flight)
            ticket = last_write[tensor_id] = store_write(tensor_id, tensor)
            return ticket

        swapper.store.read, swapper.store.write = read, write
    losses = []
    for s in range(STEPS):
        loss = engine(xs[s], ys[s])
        engine.backward(loss)
        engine.step()
        losses.append(float(loss))
    engine.destroy()
    return losses, seen, PARAM_WRITES_IN_FLIGHT


@pytest.mark.parametrize("overlap", [False, True])
def test_no_shard_read_starts_while_a_write_is_in_flight(tmp_path, overlap):
    ((losses, seen, cap),) = run_ranks(_train, 1, str(tmp_path), "nvme", overlap, timeout=300)
    ((reference, _, _),) = run_ranks(_train, 1, str(tmp_path), "cpu", False, timeout=300)
    assert seen["reads"] > 0 and seen["while_writing"] == 0, seen
    assert 1 < seen["most_in_flight"] <= cap, seen  # asynchronous, and bounded
    assert losses == reference, (losses, reference)
