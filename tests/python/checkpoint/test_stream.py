"""Streamed checkpoint files (checkpoint/stream.py, Note [Streamed checkpoint files]): what
torch.load alone reads back, where the bytes are in the file, streamed sources, and lazy
reads checked against the manifest."""

import os
import subprocess
import sys

import pytest
import torch

from prerequisites import missing
from zerostream.checkpoint import files, stream

if not stream.AVAILABLE:
    missing(
        "this torch has no skip_data (requirements.txt pins one that has)", allow_module_level=True
    )


def sample():
    big = torch.randn(300_000)
    return {
        "big": big,
        "view": big[1000:3000],  # a view of a larger storage: saved as its own storage
        "tied": [big, big],
        "bf16": torch.randn(513, dtype=torch.bfloat16),
        "ints": torch.arange(7),
        "empty": torch.empty(0),
        "transposed": torch.randn(40, 30).t(),
        "step": 5,
        "nested": {"t": (1, torch.ones(3))},
    }


def assert_same(a, b):
    for k in ("big", "view", "bf16", "ints", "empty", "transposed"):
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    assert torch.equal(a["tied"][1], b["big"]) and a["step"] == 5
    assert torch.equal(a["nested"]["t"][1], b["nested"]["t"][1])


def test_torch_alone_reads_it_and_the_manifest_covers_every_byte(tmp_path):
    obj = sample()
    path = str(tmp_path / "f.pt")
    entry = files.save_file(obj, path)
    assert entry["bytes"] == os.path.getsize(path)
    ranges = entry["ranges"]
    assert ranges[0][0] == 0 and ranges[-1][1] == entry["bytes"]
    # Every byte is in exactly one range, except the zero gaps torch leaves before a payload
    # to align it (inside skipped spans), which nothing reads.
    for (_, a_end, _, _), (b_start, _, _, _) in zip(ranges, ranges[1:]):
        assert a_end <= b_start
    payloads = [r for r in ranges if r[3]]
    assert all(start % stream.ALIGN == 0 for start, _, _, _ in payloads)
    # The largest payload is the big tensor's bytes, verbatim, at its offset on disk.
    start, end, _, _ = max(payloads, key=lambda r: r[1] - r[0])
    with open(path, "rb") as f:
        f.seek(start)
        raw = f.read(end - start)
    assert raw == obj["big"].numpy().tobytes()
    # A process that never imports zerostream: plain torch.load, weights only.
    code = (
        "import sys, torch; d = torch.load(sys.argv[1], weights_only=True); "
        "print(float(d['big'].sum()), d['view'].untyped_storage().nbytes(), "
        "d['tied'][0].data_ptr() == d['tied'][1].data_ptr())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, path], capture_output=True, text=True, check=True
    ).stdout.split()
    assert float(out[0]) == pytest.approx(float(obj["big"].sum()), rel=1e-5)
    assert out[1] == str(2000 * 4) and out[2] == "True"
    assert_same(torch.load(path, weights_only=True), obj)
    assert_same(files.load_file(path, {"f.pt": entry}), obj)


class ReusedBufferSource:
    """A source whose chunks all come through one small buffer, as the NVMe swap store's
    staging buffers do: the file must still hold every chunk's own bytes."""

    def __init__(self, values: torch.Tensor, chunk: int):
        self.values, self.chunk = values, chunk
        self.shape, self.dtype = values.shape, values.dtype
        self.buffers = [torch.empty(chunk, dtype=values.dtype) for _ in range(stream.DEPTH)]
        self.yielded = 0

    def chunks(self):
        for i, lo in enumerate(range(0, self.values.numel(), self.chunk)):
            piece = self.values[lo : lo + self.chunk]
            buf = self.buffers[i % stream.DEPTH][: piece.numel()]
            buf.copy_(piece)
            self.yielded += 1
            yield buf


def test_a_streamed_source_is_written_chunk_by_chunk(tmp_path):
    values = torch.randn(1_000_003)
    source = ReusedBufferSource(values, 65_536)
    path = str(tmp_path / "s.pt")
    entry = files.save_file({"state": {"exp_avg": source}, "n": 1}, path)
    assert source.yielded == 16
    back = files.load_file(path, {"s.pt": entry})
    assert torch.equal(back["state"]["exp_avg"], values)


def test_lazy_reads_are_checked_and_a_damaged_payload_is_named(tmp_path):
    values = torch.randn(1 << 20)  # 4 MiB: above LAZY_BYTES
    path = str(tmp_path / "l.pt")
    entry = files.save_file({"m": values, "small": torch.ones(4)}, path)
    manifest = {"l.pt": entry}
    lazy = files.load_file(path, manifest, lazy=True)
    assert isinstance(lazy["m"], stream.FileTensor) and torch.is_tensor(lazy["small"])
    out = torch.empty(1 << 20)
    for lo in range(0, 1 << 20, 300_000):  # in order, odd piece sizes
        n = min(300_000, (1 << 20) - lo)
        lazy["m"].read_into(out[lo : lo + n], lo)
    assert torch.equal(out, values)
    start, end, _, _ = max((r for r in entry["ranges"] if r[3]), key=lambda r: r[1] - r[0])
    with open(path, "r+b") as f:
        f.seek((start + end) // 2)
        byte = f.read(1)
        f.seek((start + end) // 2)
        f.write(bytes([byte[0] ^ 0x10]))
    lazy = files.load_file(path, manifest, lazy=True)
    with pytest.raises(ValueError, match=r"l\.pt is corrupted: bytes \["):
        lazy["m"].materialize()
    with pytest.raises(ValueError, match=r"l\.pt is corrupted"):
        files.load_file(path, manifest)


def test_a_read_plan_fills_slices_in_one_checked_pass(tmp_path, monkeypatch):
    from zerostream.checkpoint import slices

    monkeypatch.setattr(slices, "SCRATCH_BYTES", 1 << 20)  # several scratch passes
    a, b = torch.randn(700_000), torch.randn(500_000, dtype=torch.float64)
    small = torch.arange(10, dtype=torch.float32)
    path = str(tmp_path / "p.pt")
    entry = files.save_file({"a": a, "b": b, "small": small}, path)
    manifest = {"p.pt": entry}

    def planned(lazy, lo, hi):
        whole = slices.Slice.cat(
            [slices.Slice.of(lazy["a"]), slices.Slice.zeros(5), slices.Slice.of(lazy["small"])]
        )
        out = torch.full((hi - lo,), float("nan"))
        plan = slices.ReadPlan()
        whole[lo:hi].read_into(out, plan)
        plan.run()
        return out

    lazy = files.load_file(path, manifest, lazy=True)
    assert isinstance(lazy["a"], stream.FileTensor) and isinstance(lazy["b"], stream.FileTensor)
    reference = torch.cat([a, torch.zeros(5), small])
    for lo, hi in ((0, reference.numel()), (123_457, 699_999), (699_990, 700_012)):
        assert torch.equal(planned(lazy, lo, hi), reference[lo:hi]), (lo, hi)
    # One flipped byte in `a` outside the wanted range is still found (the pass checks the
    # whole tensor); one in `b`, which nothing wants, is never read.
    ranges = sorted((r for r in entry["ranges"] if r[3]), key=lambda r: r[1] - r[0])
    (b_start, _, _, _), (a_start, a_end, _, _) = ranges[-1], ranges[-2]
    assert a_end - a_start == a.numel() * 4
    for damaged, where in (("b", b_start + 8), ("a", a_end - 4)):
        with open(path, "r+b") as f:
            f.seek(where)
            byte = f.read(1)
            f.seek(where)
            f.write(bytes([byte[0] ^ 0x01]))
        lazy = files.load_file(path, manifest, lazy=True)
        if damaged == "b":  # unread, so the plan succeeds
            assert torch.equal(planned(lazy, 10, 20), reference[10:20])
        else:
            with pytest.raises(ValueError, match=r"p\.pt is corrupted: bytes \["):
                planned(lazy, 10, 20)


AIO = {"backend": "threads", "queue_depth": 2, "block_size": 262144, "intra_op_parallelism": 2}


def save_and_load_through_aio(rank, world, root):
    """Saves and loads with a ds_config `aio` section, recording the settings of every I/O
    engine a checkpoint byte went through; the resumed losses must equal the continued run."""
    from ckpt_run import config, train

    import zerostream
    from zerostream.offload.io_engine import IoEngine

    used = []
    for name in ("write", "read"):
        original = getattr(IoEngine, name)

        def spy(self, tensor, path, offset=0, _original=original, _name=name):
            if os.path.basename(path).endswith(".pt.partial") or path.endswith(".pt"):
                c = self.config
                used.append(
                    (_name, self.backend, c.queue_depth, c.block_size, c.threads, tensor.nbytes)
                )
            return _original(self, tensor, path, offset)

        setattr(IoEngine, name, spy)
    case = (2, "cpu", "none", "fp32")

    def engine():
        torch.manual_seed(0)
        from tiny_gpt import TinyGPT

        cfg = config(case, world, os.path.join(root, "nvme"))
        cfg["aio"] = AIO
        built, *_ = zerostream.initialize(model=TinyGPT(), config=cfg)
        return built

    first = engine()
    train(first, rank, world, 0, 2)
    first.save_checkpoint(os.path.join(root, "ckpt"))
    continued = train(first, rank, world, 2, 2)
    second = engine()
    second.load_checkpoint(os.path.join(root, "ckpt"))
    return used, continued, train(second, rank, world, 2, 2)


def test_the_aio_section_sets_the_checkpoint_io_engine(tmp_path):
    """Checkpoint files stream through an I/O engine built from the run's `aio` section
    (backend, queue depth, block size, intra_op_parallelism), as the swap store's does."""
    from multirank import run_ranks

    for used, continued, resumed in run_ranks(save_and_load_through_aio, 2, str(tmp_path)):
        assert resumed == continued
        kinds = {u[0] for u in used}
        assert kinds == {"write", "read"}, used
        assert sum(u[5] for u in used) > 100_000  # the state's tensors, not only headers
        settings = {u[1:5] for u in used}
        assert settings == {("threads", 2, 262144, 2)}, settings


def test_aio_keys_the_config_does_not_set_keep_the_engines_defaults_for_checkpoints():
    """The swap store takes the whole resolved aio section (DeepSpeed's defaults included);
    checkpoint files take only the keys the ds_config sets, else the engine's own defaults
    (a deeper queue than DeepSpeed's 8: benchmarks/checkpoint.md)."""
    from zerostream.config import load
    from zerostream.offload.io_engine import io_config, io_config_for

    cfg = load(
        {"train_micro_batch_size_per_gpu": 1, "aio": {"block_size": 262144, "use_gds": True}},
        world_size=1,
        log=False,
    )
    engine = files.io_engine(cfg.aio, given=cfg.raw["aio"].keys())
    defaults = io_config()
    assert engine.config.block_size == 262144
    assert engine.config.queue_depth == defaults.queue_depth != cfg.aio.queue_depth == 8
    with pytest.raises(NotImplementedError, match="aio.use_gds"):  # the swap path refuses it
        io_config_for(cfg.aio)
    assert io_config_for(cfg.aio, given=["queue_depth"]).block_size == defaults.block_size
