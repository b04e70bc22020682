"""The simulated device itself (zerostream/testing/sim_device.py, Note [The simulated
device]): each mistake a GPU punishes must show on it, through the copy stage's CudaLanes
exactly as the engine drives them. Every test here is one such mistake made on purpose (or
the correct use beside it), and what the device must report."""

import threading

import pytest
import torch

from zerostream.offload import copy_stage
from zerostream.offload.host_buffers import HostArena
from zerostream.testing import sim_device


@pytest.fixture
def sim():
    with sim_device.installed(policy="lazy", device_index=1) as device:
        device.set_device(1)
        yield device


def _pinned(numel, dtype=torch.float32):
    return HostArena(1 << 20, register=True).empty(numel, dtype)


def test_a_copy_lands_only_when_waited_for_and_the_host_sees_it_only_then(sim):
    lanes = copy_stage.lanes_for(torch.device("cpu"))
    assert lanes.kind == "cuda"
    src, dst = torch.arange(8.0), _pinned(8)
    event = lanes.copy(dst, src, upload=False)
    assert dst.isnan().all(), "poisoned until the copy completed and the host knows it"
    assert not lanes.ready(event)  # lazy: nothing completes by itself
    lanes.host_wait(event)
    assert torch.equal(dst, src)
    assert sim.counters["host_syncs"] == 1 and sim.counters["spin_waits"] == 0


def test_a_compute_stream_wait_orders_the_device_but_tells_the_host_nothing(sim):
    lanes = copy_stage.lanes_for(torch.device("cpu"))
    src, dst = torch.arange(8.0), _pinned(8)
    event = lanes.copy(dst, src, upload=False)
    lanes.device_wait(event)  # the compute stream waits: src may now be overwritten
    src.zero_()
    assert dst.isnan().all()  # but the host has not observed the download
    assert not lanes.ready(event)  # lazily, a query tells only what the host waited for
    lanes.host_wait(event)
    assert torch.equal(dst, torch.arange(8.0)), "read before the compute stream rewrote it"


def test_overwriting_a_download_source_without_waiting_loses_the_values(sim):
    lanes = copy_stage.lanes_for(torch.device("cpu"))
    src, dst = torch.arange(8.0), _pinned(8)
    event = lanes.copy(dst, src, upload=False)
    src.zero_()  # no device_wait: on a GPU this races the DMA; here the DMA loses
    lanes.host_wait(event)
    assert torch.equal(dst, torch.zeros(8))


def test_rewriting_an_upload_source_before_the_host_knew_it_completed_is_reported():
    with pytest.raises(AssertionError, match="rewrote the source of an upload"):
        with sim_device.installed(policy="lazy") as sim:
            sim.set_device(0)
            lanes = copy_stage.lanes_for(torch.device("cpu"))
            src, dst = _pinned(8), torch.zeros(8)
            src.copy_(torch.arange(8.0))
            event = lanes.copy(dst, src, upload=True)
            lanes.device_wait(event)  # the device is ordered; the host still knows nothing
            src.fill_(7.0)  # the next step's update, say
            lanes.host_wait(event)


def test_a_device_buffer_freed_under_a_queued_copy_without_record_stream_is_reported():
    cuda_calls = []

    with pytest.raises(AssertionError, match="freed while lane0 still had a copy queued"):
        with sim_device.installed(policy="lazy") as sim:
            sim.set_device(0)
            cuda = sim_device.SimCuda(sim, 0)
            cuda.keep_alive = lambda tensor, stream: cuda_calls.append(stream)  # deleted
            lanes = copy_stage.CudaLanes(cuda)
            dst = _pinned(1024)
            event = lanes.copy(dst, torch.ones(4096)[:1024], upload=False)  # src dropped
            lanes.host_wait(event)
    assert cuda_calls, "the lanes did ask for it"


def test_record_stream_keeps_a_dropped_device_buffer_valid(sim):
    lanes = copy_stage.lanes_for(torch.device("cpu"))
    dst = _pinned(1024)
    event = lanes.copy(dst, torch.ones(4096)[:1024], upload=False)
    lanes.host_wait(event)
    assert torch.equal(dst, torch.ones(1024)) and sim.violations == []


def test_a_copy_not_ordered_after_the_compute_stream_is_reported():
    with pytest.raises(AssertionError, match="without the lane waiting for the compute"):
        with sim_device.installed(policy="eager") as sim:
            sim.set_device(0)
            cuda = sim_device.SimCuda(sim, 0)
            lanes = copy_stage.CudaLanes(cuda)
            grad = torch.ones(16) * 3  # produced by the compute stream just now
            with cuda.use(lanes.down):  # the copy, without lane.wait_stream(compute)
                cuda.copy(_pinned(16), grad, upload=False)


def _copy_after_a_wait(sim, copier: str) -> list:
    """`copier` ("second" or "first" thread) waits its lane for the compute stream and then
    uploads; between the two the first thread (which installed the device) queues a compute
    op. Returns what the device reported."""
    cuda = sim_device.SimCuda(sim, 1)
    lanes = copy_stage.CudaLanes(cuda)
    src, dst = _pinned(16), torch.empty(16, device="cpu:1")
    waited, go_on = threading.Event(), threading.Event()

    def wait_then_copy(between=None):
        sim.set_device(1)
        lanes.up.wait_stream(cuda.current_stream())
        waited.set()
        if between is not None:
            between()
        go_on.wait(10)
        with cuda.use(lanes.up):
            cuda.copy(dst, src, upload=True)
            done = cuda.new_event(blocking=True)
            done.record()
        done.synchronize()

    def forward_op():
        torch.ones(8, device="cpu:1").add_(1)

    if copier == "second":
        worker = threading.Thread(target=wait_then_copy)
        worker.start()
        waited.wait(10)
        forward_op()  # the first thread's forward, after the second thread's wait
        go_on.set()
        worker.join()
    else:
        go_on.set()
        wait_then_copy(between=forward_op)  # its own op after its own wait
    found = list(sim.violations)
    sim.violations.clear()
    return found


def test_a_copy_needs_its_own_threads_work_waited_for_not_another_threads(sim):
    """An update behind the forward (zero/overlap.py) copies from a second thread: compute
    ops the first thread queued after that thread's wait are unordered with its copy on a
    GPU too, and not reported; an op of the copying thread itself after its wait is.
    (Only the thread that installed the device has its torch ops seen: dispatch modes are
    thread-local; Note [The simulated device], what it still cannot see.)"""
    assert _copy_after_a_wait(sim, "second") == []
    found = _copy_after_a_wait(sim, "first")
    assert any("without the lane waiting for the compute" in v for v in found), found


def test_a_thread_that_never_set_the_device_is_reported():
    with pytest.raises(AssertionError, match="never set one"):
        with sim_device.installed(policy="eager", device_index=1) as sim:
            sim.set_device(1)
            lanes = copy_stage.lanes_for(torch.device("cpu"))
            event = lanes.copy(_pinned(4), torch.ones(4), upload=False)
            worker = threading.Thread(target=lambda: event.synchronize(), name="unbound")
            worker.start()
            worker.join()


def test_the_copy_stage_consumer_thread_binds_the_device(sim):
    stage = copy_stage.CopyStage(torch.device("cpu"), slot_bytes=4096, slots=2)
    assert stage._ring.thread is not None  # the GPU path: downloads land on their own thread
    landed = []
    stage.to_host(torch.arange(2048.0), lambda at, chunk: landed.append(chunk.clone()))
    stage.drain()
    assert torch.equal(torch.cat(landed), torch.arange(2048.0))
    assert ("zs-copy-consumer", 1) in sim.set_device_calls


def test_copies_from_pageable_memory_and_spinning_waits_are_counted(sim):
    cuda = sim_device.SimCuda(sim, 1)
    lanes = copy_stage.CudaLanes(cuda)
    lanes.copy(torch.zeros(4), torch.ones(4), upload=True)  # pageable source
    event = cuda.new_event(blocking=False)
    event.record(lanes.up)
    event.synchronize()
    assert sim.counters["pageable_copies"] == 1 and sim.counters["spin_waits"] == 1


def test_an_object_collective_on_the_wrong_device_is_reported(one_rank_process_group):
    import torch.distributed as dist

    from zerostream import comm

    comm.init_distributed()
    with pytest.raises(AssertionError, match="NCCL would put its bytes on cuda:0"):
        with sim_device.installed(policy="eager", device_index=1):
            out = [None]
            comm.all_gather_object(out, "trace digest")  # nobody set the device
    assert dist.is_initialized()


def test_random_delays_complete_work_by_themselves(sim):
    with sim_device.installed(policy="random", seed=3, max_delay_s=0.001) as rnd:
        rnd.set_device(0)
        lanes = copy_stage.lanes_for(torch.device("cpu"))
        dst = _pinned(8)
        event = lanes.copy(dst, torch.arange(8.0), upload=False)
        for _ in range(2000):
            if lanes.ready(event):
                break
            threading.Event().wait(0.001)
        assert lanes.ready(event) and torch.equal(dst, torch.arange(8.0))
        assert rnd.counters["host_syncs"] == 0


def test_a_staging_buffer_released_before_its_upload_completed_is_reported():
    with pytest.raises(AssertionError, match="released to its arena while a copy"):
        with sim_device.installed(policy="lazy") as sim:
            sim.set_device(0)
            lanes = copy_stage.lanes_for(torch.device("cpu"))
            arena = HostArena(1 << 20, register=True)
            staging = arena.empty(1024)
            event = lanes.copy(torch.zeros(1024, dtype=torch.uint8), staging, upload=True)
            del staging  # back to the arena: the next disk read may land in it
            lanes.host_wait(event)


def test_the_copy_stage_keeps_an_uploads_source_until_it_is_known_complete(sim):
    stage = copy_stage.CopyStage(torch.device("cpu"), slot_bytes=4096, slots=2)
    arena = HostArena(1 << 20, register=True)
    staging = arena.empty(256, torch.float32)
    staging.copy_(torch.arange(256.0))
    dst = torch.zeros(256)
    stage.upload(staging, dst)
    del staging  # the caller is done with it; the stage is not
    assert arena.stats()["allocations"] == 1
    assert not stage.release_held()  # lazily not complete: still held
    assert stage.release_held(wait=True)  # the host waits for it, then lets it go
    assert arena.stats()["allocations"] == 0
    stage.fence()
    assert torch.equal(dst, torch.arange(256.0))


def test_what_the_host_learns_from_an_event_it_learns_about_what_came_before(sim):
    cuda = sim_device.SimCuda(sim, 1)
    lanes = copy_stage.CudaLanes(cuda)
    # Through the compute stream: it waited for the download, then recorded an event.
    dst = _pinned(8)
    lanes.device_wait(lanes.copy(dst, torch.arange(8.0), upload=False))
    after = cuda.new_event(blocking=True)
    after.record(cuda.current_stream())
    after.synchronize()
    assert torch.equal(dst, torch.arange(8.0))
    # Through another lane: the upload lane waited for the download lane's copy.
    dst2 = _pinned(8)
    down = lanes.copy(dst2, torch.arange(8.0) + 1, upload=False)
    lanes.up.wait_event(down)
    later = cuda.new_event(blocking=True)
    later.record(lanes.up)
    later.synchronize()
    assert torch.equal(dst2, torch.arange(8.0) + 1)


def test_a_lane_ordered_by_an_event_of_the_compute_stream_is_ordered(sim):
    cuda = sim_device.SimCuda(sim, 1)
    lanes = copy_stage.CudaLanes(cuda)
    dst = _pinned(16)
    grad = torch.ones(16) * 2  # compute work
    mark = cuda.new_event()
    mark.record(cuda.current_stream())
    lanes.down.wait_event(mark)  # instead of wait_stream: as correct
    with cuda.use(lanes.down):
        cuda.copy(dst, grad, upload=False)
        done = cuda.new_event(blocking=True)
        done.record()
    done.synchronize()
    assert sim.violations == [] and torch.equal(dst, grad)


def test_a_registered_range_is_forgotten_with_its_buffer(sim):
    arena = HostArena(1 << 20, register=True)
    before = len(sim.registered)
    buf = arena.empty(1024)
    view = buf[10:20]
    del buf
    assert len(sim.registered) == before + 1  # a view keeps it
    del view
    assert len(sim.registered) == before


def test_a_block_that_fails_leaves_nothing_waiting_on_the_device():
    import gc

    with pytest.raises(ValueError, match="the test's own"):
        with sim_device.installed(policy="lazy") as sim:
            sim.set_device(0)
            stage = copy_stage.CopyStage(torch.device("cpu"), slot_bytes=4096, slots=2)
            stage.upload(_pinned(16), torch.zeros(16))
            raise ValueError("the test's own error")
    del stage
    gc.collect()  # its finalizer neither waits nor hangs on the closed device
    copy_stage._release_orphans()
