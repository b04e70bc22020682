"""Checkpoint bytes go straight between the disk and the tensors (issue 13's bandwidth).

The I/O engine reads and writes a buffer misaligned against its file offset through 1 MiB
bounce buffers on its completion thread (Note [Bounce buffers]): on the dev VM's disk that
halved a load (benchmarks/checkpoint.md). torch's allocator aligns to 64 B, so the large
tensors a checkpoint moves are allocated 4 KiB aligned instead (offload/host_buffers.aligned_empty):
the CPU optimizers' states and the CPU flat weight buffers. And a load fills fresh memory
(a resumed process has never stepped, so its Adam moments are new), whose pages would be
faulted in on the I/O path; each chunk is populated just before its read (Note [Populate
before reading]).

Checked: the engine's bounce count (it does count: a torch.empty destination makes it
move), the alignment itself, and a whole stage-2 cpu-offload save and load into a fresh
engine with no bounce buffer and the state restored exactly; a load into the live run
writes the states in place.
"""

import os

import pytest
import torch

from equal import same_tensors
from multirank import run_ranks
from zerostream.offload.host_buffers import DIRECT_ALIGN, aligned_empty, populate
from zerostream.offload.io_engine import IoEngine


def _direct_dir(tmp_path):
    """tmp_path where O_DIRECT works (tmpfs before Linux 6.6 refuses it)."""
    probe = tmp_path / "probe"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o644)
    except OSError:
        pytest.skip(f"{tmp_path} refuses O_DIRECT")
    os.close(fd)
    return tmp_path


def test_misaligned_buffers_bounce_and_aligned_ones_do_not(tmp_path):
    path = str(_direct_dir(tmp_path) / "data.bin")
    data = torch.randint(0, 256, (8 << 20,), dtype=torch.uint8)
    engine = IoEngine()
    engine.write(aligned_empty(data.numel()).copy_(data), path).wait()
    assert engine.bounce_buffers == 0

    aligned = aligned_empty(data.numel())
    assert aligned.data_ptr() % DIRECT_ALIGN == 0
    engine.read(populate(aligned), path).wait()
    assert engine.bounce_buffers == 0 and torch.equal(aligned, data)

    # 64 bytes past a page boundary: misaligned by construction (a plain torch.empty is
    # 64-byte aligned and now and then lands on a page boundary; CI once saw it).
    plain = aligned_empty(data.numel() + 64)[64:]
    assert plain.data_ptr() % DIRECT_ALIGN == 64
    engine.read(plain, path).wait()
    assert engine.bounce_buffers > 0 and torch.equal(plain, data)


@pytest.mark.parametrize(
    "shape,dtype", [((3, 1000), torch.float32), (5, torch.bfloat16), ((0,), torch.uint8)]
)
def test_aligned_empty_gives_the_asked_tensor_on_a_4k_boundary(shape, dtype):
    t = aligned_empty(shape, dtype)
    want = torch.Size(shape if isinstance(shape, tuple) else (shape,))
    assert t.shape == want and t.dtype == dtype and t.is_contiguous()
    assert t.data_ptr() % DIRECT_ALIGN == 0


def _save_and_load(rank, world, root):
    import zerostream
    from zerostream.checkpoint import files

    def build(seed):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(*(torch.nn.Linear(512, 512, bias=False) for _ in range(3)))
        config = {
            "train_micro_batch_size_per_gpu": 2,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
            "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
            "bf16": {"enabled": True},
        }
        engine, *_ = zerostream.initialize(model=model, config=config)
        return engine

    files._ENGINES.clear()  # this test's own checkpoint engine, bounce count at 0
    engine = build(0)
    x = torch.randn(2, 512, dtype=torch.bfloat16)
    engine.backward(engine(x).float().pow(2).mean())
    engine.step()
    opt = engine.optimizer.optimizer  # the CPU Adam over the flat fp32 partition
    states = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
    moments = [t for t in states if t.numel() * 4 >= 1 << 20]
    assert len(moments) == 2
    aligned = {
        "flat weights": [f.buffer.data_ptr() % 4096 for f in engine.optimizer.flat_groups],
        "moments": [t.data_ptr() % 4096 for t in moments],
    }
    saved = [t.clone() for t in moments]
    engine.save_checkpoint(os.path.join(root, "ckpt"))
    # A load into the live run writes its states in place: no second copy, no fresh pages.
    engine.backward(engine(x).float().pow(2).mean())
    engine.step()
    ptrs = [t.data_ptr() for t in moments]
    engine.load_checkpoint(os.path.join(root, "ckpt"))
    now = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
    now = [t for t in now if t.numel() * 4 >= 1 << 20]
    in_place = [t.data_ptr() for t in now] == ptrs and all(map(torch.equal, now, saved))
    fresh = build(1)  # never stepped: its moments are made by the load
    fresh.load_checkpoint(os.path.join(root, "ckpt"))
    loaded = [
        t
        for s in fresh.optimizer.optimizer.state.values()
        for t in s.values()
        if torch.is_tensor(t) and t.numel() * 4 >= 1 << 20
    ]
    weights = {n: p.detach().clone() for n, p in fresh.module.named_parameters()}
    want = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    return {
        "aligned": aligned,
        "loaded_aligned": [t.data_ptr() % 4096 for t in loaded],
        "in_place": in_place,
        "moments_equal": len(loaded) == 2 and all(map(torch.equal, saved, loaded)),
        "weights_equal": same_tensors(weights, want),
        "bounce_buffers": files.io_engine_for(fresh._checkpoint_target()).bounce_buffers,
    }


def test_a_cpu_offload_checkpoint_moves_without_bounce_buffers(tmp_path):
    got = run_ranks(_save_and_load, 1, str(_direct_dir(tmp_path)), timeout=300)[0]
    assert got["aligned"] == {"flat weights": [0], "moments": [0, 0]}, got
    assert got["loaded_aligned"] == [0, 0] and got["in_place"], got
    assert got["moments_equal"] and got["weights_equal"], got
    assert got["bounce_buffers"] == 0, got
