"""DeepSpeed's pinned-memory API over zerostream's locked tensors: the pin_memory op's
pin_handle, the aio handle's locked buffers, the native backend of the accelerator's
pin_memory, and the pinned-memory tally.

"Pinned" on a CPU machine means mlock(2)ed: the kernel keeps the pages resident and counts
them in /proc/self/status VmLck, which is what these tests read. (torch's pin_memory, which
registers memory with a GPU for asynchronous DMA, is a no-op on a CPU accelerator.)"""

from __future__ import annotations

import gc
import logging
import re

import pytest
import torch

from zerostream.accelerator import get_accelerator
from zerostream.offload.locked_tensors import LockedTensors, locked_tensors
from zerostream.offload.pin_tally import PinnedMemoryTracker, fmt_bytes, tally
from zerostream.ops.aio import AsyncIOBuilder
from zerostream.ops.pin_memory import PinMemoryBuilder

MiB = 1 << 20


def _vm_locked_bytes() -> int:
    with open("/proc/self/status") as f:
        return int(re.search(r"VmLck:\s+(\d+) kB", f.read()).group(1)) * 1024


def test_locked_tensors_are_mlocked_and_unlocked_when_the_last_view_goes():
    # VmLck is the process's: arenas earlier tests left to the garbage collector go first,
    # so the readings below see this manager's locking only.
    gc.collect()
    mgr = LockedTensors(budget_bytes=64 * MiB)
    before = _vm_locked_bytes()
    t = mgr.new(4 * MiB // 4, torch.float32)
    if mgr.stats()["unlocked"]:
        pytest.skip("mlock refused here (RLIMIT_MEMLOCK); the arena fell back to pageable")
    assert _vm_locked_bytes() - before >= 4 * MiB
    view = t.narrow(0, 1000, 10)
    assert mgr.is_pinned(view) and mgr.is_pinned(t[5:])
    del t
    gc.collect()
    assert mgr.stats()["tensors"] == 1  # the view keeps the allocation, and its range
    assert _vm_locked_bytes() - before >= 4 * MiB
    del view
    gc.collect()
    assert mgr.stats()["tensors"] == 0 and mgr.stats()["in_use"] == 0
    assert _vm_locked_bytes() - before < 4 * MiB


def test_pin_handle_and_aio_handle_share_one_manager_by_address_range():
    pin = PinMemoryBuilder().load().pin_handle()
    aio = AsyncIOBuilder().load().aio_handle(1024, 2, False, False, 1)
    a = pin.new_cpu_locked_tensor(4096, torch.empty(0, dtype=torch.bfloat16))
    b = aio.new_cpu_locked_tensor(4096, torch.empty(0, dtype=torch.uint8))
    assert a.dtype == torch.bfloat16 and a.numel() == 4096 and b.numel() == 4096
    assert aio.is_pinned(a.narrow(0, 4095, 1)) and pin.is_pinned(b[100:])
    plain = torch.empty(4096)
    assert not pin.is_pinned(plain) and not aio.is_pinned(plain)
    assert not pin.is_pinned(torch.empty(4, device="meta"))
    assert pin.free_cpu_locked_tensor(a) and not pin.free_cpu_locked_tensor(a)
    assert not aio.is_pinned(a)  # forgotten, though its memory lives while `a` does
    assert not aio.free_cpu_locked_tensor(plain)
    assert pin.free_cpu_locked_tensor_by_ptr(b.data_ptr())


def test_native_pin_copies_values_and_shape_and_unpins_the_range_recorded_at_pin_time():
    mgr = locked_tensors()
    src = torch.arange(24, dtype=torch.float64).reshape(2, 3, 4)
    pinned = mgr.pin(src)
    assert pinned.shape == src.shape and torch.equal(pinned, src) and pinned.ds_pinned
    assert mgr.pin(src, match_shape=False).shape == (24,)
    assert mgr.pin(src, make_copy=False).shape == (2, 3, 4)
    begin = pinned.data_ptr()
    pinned.data = torch.zeros(2, 3, 4, dtype=torch.float64)  # ZeRO rebinding .data
    assert mgr.unpin(pinned) and begin not in mgr.ranges and not pinned.ds_pinned
    assert not mgr.unpin(pinned)


def test_accelerator_pin_memory_follows_ds_pin_memory_backend(monkeypatch):
    accel = get_accelerator()
    src = torch.arange(8, dtype=torch.float32)
    monkeypatch.delenv("DS_PIN_MEMORY_BACKEND", raising=False)
    torch_pinned = accel.pin_memory(src)
    assert accel.unpin_memory(torch_pinned) is None
    assert not getattr(torch_pinned, "ds_pinned", False)
    monkeypatch.setenv("DS_PIN_MEMORY_BACKEND", "native")
    native = accel.pin_memory(src)
    assert native.data_ptr() != src.data_ptr() and torch.equal(native, src)
    assert accel.is_pinned(native[3:]) and not accel.is_pinned(src)
    assert accel.unpin_memory(native) is True and not accel.is_pinned(native[3:])


def test_tally_counts_each_accelerator_pin_and_its_bytes(monkeypatch):
    monkeypatch.setenv("DS_PIN_MEMORY_BACKEND", "native")
    t = tally()
    t.reset()
    tensors = [torch.zeros(n, dtype=torch.float16) for n in (10, 300, 4096)]
    for x in tensors:
        get_accelerator().pin_memory(x)
    assert t._calls == 3 and t._bytes == 2 * (10 + 300 + 4096)
    t.reset()


def test_tally_logs_each_doubling_checkpoint_once(caplog):
    log = logging.getLogger("zerostream.test_pin_tally")
    tracker = PinnedMemoryTracker(log)
    gb = 1 << 30
    with caplog.at_level(logging.INFO, logger=log.name):
        tracker.track(31 * gb)
        tracker.track(2 * gb)  # 33: crosses 32
        tracker.track(100 * gb)  # 133: crosses 64 and 128
    lines = [r.getMessage() for r in caplog.records if "checkpoint" in r.getMessage()]
    assert len(lines) == 3 and "32.000 GB" in lines[0] and "128.000 GB" in lines[2]
    assert tracker._next_checkpoint == 256 * gb
    assert [fmt_bytes(n) for n in (512, 2048, MiB, gb)] == [
        "512 B",
        "2.0 KB",
        "1.00 MB",
        "1.000 GB",
    ]


def test_errors_name_the_argument():
    mgr = locked_tensors()
    with pytest.raises(ValueError, match="num_elem must be an int >= 0; got -1"):
        mgr.new(-1, torch.float32)
    with pytest.raises(ValueError, match="dtype must be a torch.dtype"):
        mgr.new(4, "float32")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pin_memory: tensor must be a CPU torch.Tensor"):
        mgr.pin(torch.empty(4, device="meta"))
    with pytest.raises(ValueError, match="example_tensor must be a torch.Tensor"):
        PinMemoryBuilder().load().pin_handle().new_cpu_locked_tensor(4, torch.float32)
    with pytest.raises(ValueError, match="num_bytes must be an int >= 0"):
        tally().track(-5)


def _offloaded_engine(stage: int):
    import zerostream
    from mlp import MLP

    torch.manual_seed(0)
    model = MLP()
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
        "zero_optimization": {
            "stage": stage,
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
        },
    }
    engine = zerostream.initialize(model=model, config=config)[0]
    engine.backward(engine(torch.randn(2, 8)))
    engine.step()
    return engine


@pytest.mark.parametrize("stage", [2, 3])
def test_the_native_backend_knows_the_offloaded_optimizer_s_buffers_until_destroy(
    stage, monkeypatch, one_rank_process_group
):
    """DS_PIN_MEMORY_BACKEND=native: the offloaded optimizer's page-locked masters and
    gradient partitions are the shared manager's (is_pinned knows them, as DeepSpeed's
    native manager does), and destroy() gives every range back; without it none is added."""
    gc.collect()
    manager = locked_tensors()
    before = set(manager.ranges)
    engine = _offloaded_engine(stage)
    assert set(manager.ranges) == before  # the torch backend: not the manager's
    engine.destroy()

    monkeypatch.setenv("DS_PIN_MEMORY_BACKEND", "native")
    engine = _offloaded_engine(stage)
    opt = engine.optimizer
    added = set(manager.ranges) - before
    buffers = list(opt.masters) + list(opt.grads)
    assert {t.data_ptr() for t in buffers} == added, "the masters and gradient partitions"
    assert all(manager.is_pinned(t[1:]) for t in buffers if t.numel() > 1)  # views too
    engine.destroy()
    assert set(manager.ranges) == before
