"""The simulated device's compute pseudo-lane, host reads, caching-allocator model and step
budgets (zerostream/testing/sim_compute.py, sim_memory.py, step_budget.py): each mistake a
GPU punishes there, made on purpose, and the correct use beside it."""

import pytest
import torch

from zerostream.offload.host_buffers import HostArena
from zerostream.testing import sim_device
from zerostream.testing.step_budget import StepCounters


@pytest.fixture
def sim():
    with sim_device.installed(policy="lazy", track_memory=True) as device:
        device.set_device(0)
        yield device


DEV = torch.device("cpu", 0)  # the simulated device's tensors (host ones have no index)


def _pinned(numel, dtype=torch.float32):
    return HostArena(1 << 20, register=True).empty(numel, dtype)


def _all_nan(sim, t) -> bool:
    """Looked at by the test, not the program (a program's read would synchronize)."""
    with sim.internal():
        return bool(t.isnan().all())


def _compute_event(sim):
    event = sim_device.SimCuda(sim, 0).new_event()
    event.record()
    return event


# --- the compute pseudo-lane (Note [The compute pseudo-lane]) -----------------------------------


def test_a_download_on_the_compute_stream_reaches_the_host_only_after_a_sync(sim):
    grad = torch.arange(8.0, device=DEV) * 2  # device memory
    host = _pinned(8)
    host.copy_(grad, non_blocking=True)
    assert _all_nan(sim, host), "the host may not read it before it synchronized"
    event = _compute_event(sim)
    assert not event.query(), "lazily, the copy is not done until the host waited for it"
    event.synchronize()
    assert torch.equal(host, torch.arange(8.0) * 2)
    assert sim.counters["compute_lane_copies"] == 1 and sim.violations == []


def test_a_blocking_read_of_device_memory_synchronizes_the_compute_stream(sim):
    norm = torch.ones((), device=DEV) * 3
    host = _pinned(4)
    host.copy_(torch.ones(4, device=DEV), non_blocking=True)
    assert float(norm) == 3.0  # .item(): the host waits for the stream to get there
    assert torch.equal(host, torch.ones(4))
    assert sim.counters["host_reads"] == 1 and sim.counters["blocking_downloads"] == 0


def test_rewriting_the_source_of_a_compute_stream_upload_before_a_sync_is_reported():
    with pytest.raises(AssertionError, match="rewrote the source of a non_blocking copy"):
        with sim_device.installed(policy="lazy") as sim:
            sim.set_device(0)
            src, dst = _pinned(8), torch.zeros(8, device=DEV)
            src.fill_(1.0)
            dst.copy_(src, non_blocking=True)
            assert torch.equal(dst, torch.ones(8))  # the device's own order sees it
            src.fill_(2.0)  # the next batch, say, written before the stream read the first


def test_an_upload_source_rewritten_after_an_event_sync_is_fine(sim):
    src, dst = _pinned(8), torch.zeros(8, device=DEV)
    src.fill_(1.0)
    dst.copy_(src, non_blocking=True)
    _compute_event(sim).synchronize()
    src.fill_(2.0)
    sim_device.SimCuda(sim, 0).current_stream().synchronize()
    assert sim.violations == [] and torch.equal(dst, torch.ones(8))


def test_copies_between_two_device_tensors_or_with_pageable_memory_are_not_pending(sim):
    a, b = torch.ones(4, device=DEV), torch.zeros(4, device=DEV)
    b.copy_(a, non_blocking=True)
    assert torch.equal(b, a) and sim.counters["compute_lane_copies"] == 0


# --- host reads ----------------------------------------------------------------------------------


def test_host_reads_of_device_memory_are_counted_and_of_registered_memory_not(sim):
    weights = torch.ones(16, device=DEV) * 2
    pinned = _pinned(16)
    weights.cpu()
    weights.to("cpu")
    weights.to(torch.device("cpu"), torch.float64)
    weights.to("cpu", non_blocking=True)  # asynchronous: no host wait
    weights[0].tolist()
    pinned.cpu()
    pinned[0].item()
    counts = sim.counters
    assert counts["blocking_downloads"] == 3, counts
    assert counts["host_reads"] == 4, counts  # three downloads and one scalar


# --- the caching allocator (Note [The caching allocator model]) ----------------------------------


def test_a_freed_block_is_reused_by_its_own_stream_only(sim):
    mem = sim.memory
    x = torch.empty(1024, device=DEV)
    del x
    y = torch.empty(1024, device=DEV)  # the compute stream's cached block
    assert mem.allocated_bytes() == 4096 and mem.reserved_bytes() == 4096
    del y
    lane = sim.new_lane(0)
    with sim.use(lane):
        z = torch.empty(1024, device=DEV)  # a lane cannot take the compute stream's cached block
    assert mem.allocated_bytes() == 4096 and mem.reserved_bytes() == 8192
    assert mem.stream_of(z.untyped_storage()) is lane
    del z
    one = torch.empty(1, device=DEV)  # the frees are seen; the compute stream's cache serves it
    assert mem.allocated_bytes() == 4 and mem.reserved_bytes() == 8192
    sim_device._sim_accelerator(sim).empty_cache()  # what another process can use again
    assert mem.reserved_bytes() == mem.allocated_bytes() == one.numel() * 4


def test_resizing_a_storage_to_nothing_is_a_free_and_back_an_allocation(sim):
    mem = sim.memory
    full = torch.zeros(1024, device=DEV)
    assert mem.allocated_bytes() == 4096
    full.untyped_storage().resize_(0)  # stage 3's free of a gathered parameter
    assert mem.allocated_bytes() == 0 and mem.reserved_bytes() == 4096
    full.untyped_storage().resize_(4096)
    assert mem.allocated_bytes() == 4096 and mem.reserved_bytes() == 4096


def test_a_cache_too_big_for_the_next_allocation_is_flushed(sim):
    mem = sim.memory
    mem.capacity = 12 << 10
    lane = sim.new_lane(0)
    with sim.use(lane):
        buf = torch.empty(2048, device=DEV)  # 8 KiB, then cached for the lane
    del buf
    keep = torch.empty(1024, device=DEV)  # 4 KiB on the compute stream: fits beside the cache
    assert mem.flushes == 0 and mem.reserved_bytes() == 12 << 10
    more = torch.empty(1024, device=DEV)  # does not: the allocator gives the cache back and retries
    assert mem.flushes == 1 and mem.reserved_bytes() == 8 << 10
    assert sim.violations == [] and keep.numel() + more.numel() == 2048


def test_a_storage_resized_to_nothing_under_a_queued_copy_without_record_stream_is_reported():
    with pytest.raises(AssertionError, match="resized to nothing"):
        with sim_device.installed(policy="lazy", track_memory=True) as sim:
            sim.set_device(0)
            cuda = sim_device.SimCuda(sim, 0)
            lane = cuda.new_stream()
            full = torch.arange(64.0, device=DEV)  # a gathered parameter
            lane.wait_stream(cuda.current_stream())
            with cuda.use(lane):
                cuda.copy(_pinned(64), full, upload=False)
            full.untyped_storage().resize_(0)  # freed: the lane may read another's data
            lane.synchronize()


def test_record_stream_keeps_a_block_resized_to_nothing_readable(sim):
    cuda = sim_device.SimCuda(sim, 0)
    lane = cuda.new_stream()
    full, host = torch.arange(64.0, device=DEV), _pinned(64)
    lane.wait_stream(cuda.current_stream())
    with cuda.use(lane):
        cuda.copy(host, full, upload=False)
    cuda.keep_alive(full, lane)
    full.untyped_storage().resize_(0)
    full.untyped_storage().resize_(256)  # regathered elsewhere; the lane still reads the old
    full.fill_(-1.0)
    lane.synchronize()
    assert sim.violations == [] and torch.equal(host, torch.arange(64.0))


def test_a_block_freed_on_the_stream_that_made_it_needs_no_record_stream(sim):
    cuda = sim_device.SimCuda(sim, 0)
    lane = cuda.new_stream()
    host = _pinned(32)
    with cuda.use(lane):
        staged = torch.ones(32, device=DEV) * 5  # made on the lane, read by the lane's own copy
    lane.wait_stream(cuda.current_stream())
    with cuda.use(lane):
        cuda.copy(host, staged, upload=False)
    del staged
    lane.synchronize()
    assert sim.violations == [] and torch.equal(host, torch.full((32,), 5.0))


# --- step budgets --------------------------------------------------------------------------------


def test_a_step_budget_names_the_step_and_counter_over_it(sim):
    steps = StepCounters(sim)
    for step in range(3):
        x = torch.ones(4, device=DEV) * step
        if step == 2:
            x.cpu()  # a blocking download the first two steps did not have
        float(x.sum())
        steps.step_done()
    (over,) = steps.over(host_reads=2, blocking_downloads=0)
    assert over.startswith("step 3: blocking_downloads 1 > budget 0 (reads at "), over
    assert "test_a_step_budget_names_the_step_and_counter_over_it x1" in over
    with pytest.raises(AssertionError, match="step 3: host_reads 2 > budget 1"):
        steps.check(host_reads=1)
    with pytest.raises(KeyError, match="no counter named"):
        steps.check(host_syncz=0)
