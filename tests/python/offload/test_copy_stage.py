"""The copy stage's CPU twin (offload/copy_stage.py): chunking, slot reuse, the order in which
landed downloads are consumed, uploads, and when the host has to wait. The same code runs the
GPU's lanes; test_device_audit.py checks those lanes' streams and events."""

import pytest
import torch

from zerostream.offload.copy_stage import CopyStage, DeviceSink, HostLanes
from zerostream.ops.adagrad import DeepSpeedCPUAdagrad
from zerostream.ops.adam import DeepSpeedCPUAdam
from zerostream.ops.lion import DeepSpeedCPULion

SLOT = 4096  # bytes: 1024 fp32 or 2048 bf16 elements a slot


class SlowLanes(HostLanes):
    """Copies that land only when the host waits for them (or a later one on the lane)."""

    def __init__(self):
        super().__init__()
        self.waited = []
        self.seq = 0
        self.done_upto = {False: 0, True: 0}

    def copy(self, dst, src, upload):
        dst.copy_(src)
        self.seq += 1
        return (upload, self.seq)

    def ready(self, event):
        return event[1] <= self.done_upto[event[0]]

    def host_wait(self, event):
        self.waited.append(event)
        self.done_upto[event[0]] = max(self.done_upto[event[0]], event[1])


def test_a_download_larger_than_a_slot_lands_in_order_and_whole():
    stage = CopyStage(torch.device("cpu"), slot_bytes=SLOT, slots=2)
    src = torch.randn(5000)  # 5 chunks of at most 1024 through 2 slots
    seen = []
    stage.to_host(src, lambda lo, chunk: seen.append((lo, chunk.clone())))
    stage.drain()
    assert [lo for lo, _ in seen] == [0, 1024, 2048, 3072, 4096]
    # Each chunk was consumed before its slot took the next one: the values are the source's.
    assert torch.equal(torch.cat([c for _, c in seen]), src)
    assert stage.stats["d2h_bytes"] == src.numel() * 4 and stage.stats["copies"] == 5


def test_consumers_run_only_once_their_copy_has_landed_and_the_host_waits_for_a_slot():
    lanes = SlowLanes()
    stage = CopyStage(torch.device("cpu"), slot_bytes=SLOT, slots=3, lanes=lanes)
    src = torch.arange(6 * 2048, dtype=torch.bfloat16)  # 6 chunks through 3 slots
    consumed = []
    stage.to_host(src, lambda lo, chunk: consumed.append(lo))
    # Chunks 3..5 each needed a slot back: the host waited for chunks 0, 1, 2 in turn and
    # consumed exactly those; the last three are still in flight.
    assert [e[1] for e in lanes.waited] == [1, 2, 3]
    assert consumed == [0, 2048, 4096]
    stage.drain()
    # One wait on the lane's last copy lands the rest: consumed in the order queued.
    assert [e[1] for e in lanes.waited] == [1, 2, 3, 6]
    assert consumed == [0, 2048, 4096, 6144, 8192, 10240]
    assert stage.stats["host_waits"] == 4


def test_uploads_through_staging_and_straight_from_host_memory():
    lanes = SlowLanes()
    stage = CopyStage(torch.device("cpu"), slot_bytes=SLOT, slots=2, lanes=lanes)
    dst = torch.zeros(3000, dtype=torch.bfloat16)
    sink = DeviceSink(dst, stage)
    assert sink.piece == 2048
    values = torch.randn(3000)
    for lo in range(0, 3000, sink.piece):
        hi = min(lo + sink.piece, 3000)
        sink.staging(lo, hi).copy_(values[lo:hi])
        sink.commit(lo, hi)
    assert torch.equal(dst, values.to(torch.bfloat16))
    # Two slots, two pieces: nobody waited; fence() orders them on the device, not the host.
    stage.fence()
    assert lanes.waited == []
    dst32 = torch.zeros(10)
    assert DeviceSink(dst32, stage).upload_from(2, 7, values[:5])
    assert torch.equal(dst32[2:7], values[:5]) and dst32[:2].eq(0).all()
    assert stage.stats["h2d_bytes"] == 3000 * 2 + 5 * 4
    stage.drain()  # the host waits once per lane, on its last copy
    assert stage.stats["host_waits"] == 1


def test_a_staging_request_larger_than_a_slot_is_refused_with_both_sizes():
    stage = CopyStage(torch.device("cpu"), slot_bytes=SLOT, slots=2)
    with pytest.raises(ValueError, match=r"4096 elements of torch.float32 exceed a slot \(1024\)"):
        stage.staging(4096, torch.float32)


@pytest.mark.parametrize("cls", [DeepSpeedCPUAdam, DeepSpeedCPUAdagrad, DeepSpeedCPULion])
def test_stepping_in_pieces_is_bitwise_the_whole_step(cls):
    torch.manual_seed(0)
    sizes = [3000, 17, 1024]
    whole = [torch.randn(n) for n in sizes]
    pieces = [p.clone() for p in whole]
    a, b = cls(whole, lr=1e-2), cls(pieces, lr=1e-2)
    copies = [torch.zeros(n, dtype=torch.bfloat16) for n in sizes]
    calls = []
    for _ in range(3):
        for p, q in zip(whole, pieces):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        a.step(grad_scale=0.5)
        calls.clear()
        b.step_in_pieces(
            1000,
            0.5,
            lambda gi, pi, lo, hi: copies[pi][lo:hi],
            lambda gi, pi, lo, hi: calls.append((pi, lo, hi)),
        )
        assert calls[:4] == [(0, 0, 1000), (0, 1000, 2000), (0, 2000, 3000), (1, 0, 17)]
    for p, q, c in zip(whole, pieces, copies):
        assert torch.equal(p, q)
        assert torch.equal(c, q.to(torch.bfloat16))  # the fused 16-bit copy of each piece
    for p, q in zip(whole, pieces):
        sa, sb = a.state[p], b.state[q]
        assert sa.keys() == sb.keys()
        for k in sa:
            assert torch.equal(torch.as_tensor(sa[k]), torch.as_tensor(sb[k])), k


def test_a_consumer_thread_lands_downloads_in_order_off_the_queuing_thread():
    import threading
    import time

    stage = CopyStage(torch.device("cpu"), slot_bytes=SLOT, slots=2, consumer_thread=True)
    src = torch.randn(5 * 1024)
    seen, threads = [], set()

    def consume(lo, chunk):
        time.sleep(0.02)  # slower than the queuing: the queuing thread must wait for slots
        threads.add(threading.get_ident())
        seen.append((lo, chunk.clone()))

    stage.to_host(src, consume)
    stage.drain()
    assert [lo for lo, _ in seen] == [0, 1024, 2048, 3072, 4096]
    assert torch.equal(torch.cat([c for _, c in seen]), src)
    assert threads and threading.get_ident() not in threads
    assert stage.stats["host_waits"] >= 3  # slots for chunks 2, 3, 4 (and maybe the drain)


@pytest.mark.parametrize("thread", [False, True])
def test_a_failing_consumer_is_raised_by_drain_and_nothing_hangs(thread):
    stage = CopyStage(torch.device("cpu"), slot_bytes=SLOT, slots=2, consumer_thread=thread)

    def consume(lo, chunk):
        if lo == 1024:
            raise ValueError("target partition too short")

    with pytest.raises(RuntimeError, match="consumer failed") as info:
        stage.to_host(torch.zeros(4 * 1024), consume)
        stage.drain()
    assert isinstance(info.value.__cause__, ValueError)


def test_asking_for_staging_with_every_slot_uncommitted_is_an_error_not_a_hang():
    stage = CopyStage(torch.device("cpu"), slot_bytes=SLOT, slots=2)
    stage.staging(8, torch.float32)
    stage.staging(8, torch.float32)
    with pytest.raises(RuntimeError, match="staged and not committed"):
        stage.staging(8, torch.float32)


def test_the_update_writes_16_bit_host_partitions_in_pass_and_others_through_the_stage():
    from zerostream.offload.sinks import fused_target, hand_on

    stage = CopyStage(torch.device("cpu"), slot_bytes=SLOT, slots=2)
    master = torch.randn(100)
    # A 16-bit partition in host memory on a GPU run (offload_param cpu): the kernel writes
    # into the partition itself, and nothing is copied after it.
    host16 = torch.zeros(100, dtype=torch.bfloat16)
    target = fused_target(host16, 10, 20)
    assert target.data_ptr() == host16[10:20].data_ptr()
    hand_on(host16, 10, 20, master[10:20], fused=True, stable=True)
    assert host16.eq(0).all() and stage.stats["copies"] == 0
    # One on the compute device: the kernel writes into staging, committed by hand_on.
    sink = DeviceSink(torch.zeros(100, dtype=torch.bfloat16), stage)
    fused_target(sink, 0, 50).copy_(master[:50])
    hand_on(sink, 0, 50, master[:50], fused=True, stable=True)
    assert torch.equal(sink.part[:50], master[:50].to(torch.bfloat16))
    # fp32 partitions are not fused: an fp32 one on the device is uploaded from a stable
    # master without staging, from a swap buffer (not stable) through a slot; a host one copied.
    sink32, host32 = DeviceSink(torch.zeros(100), stage), torch.zeros(100)
    assert fused_target(sink32, 0, 10) is None and fused_target(host32, 0, 10) is None
    hand_on(sink32, 0, 50, master[:50], fused=True, stable=True)
    assert stage._ring.free and len(stage._ups) == 1  # the bf16 commit's slot only
    hand_on(sink32, 50, 100, master[50:], fused=False, stable=False)
    assert len(stage._ups) == 2
    hand_on(host32, 0, 100, master, fused=False, stable=True)
    stage.fence()
    assert torch.equal(sink32.part, master) and torch.equal(host32, master)


def test_a_stage3_shard_sink_is_written_by_the_kernel_in_pass():
    from zerostream.offload.sinks import StagedSink, fused_target, hand_on

    class Sink(StagedSink):  # as ShardSink (zero/stage3/param_swap.py): host staging, commit
        dtype, numel = torch.bfloat16, 100

        def __init__(self):
            self.committed = []

        def staging(self, lo, hi):
            self.stage = torch.zeros(hi - lo, dtype=self.dtype)
            return self.stage

        def commit(self, lo, hi):
            self.committed.append((lo, hi, self.stage.clone()))

    sink, master = Sink(), torch.randn(100)
    fused_target(sink, 0, 100).copy_(master)  # what the kernel's param_copy does
    hand_on(sink, 0, 100, master * 0, fused=True, stable=False)
    [(lo, hi, values)] = sink.committed
    assert (lo, hi) == (0, 100) and torch.equal(values, master.to(torch.bfloat16))


def test_a_direct_download_takes_no_slot_and_drain_waits_once_on_the_lane():
    lanes = SlowLanes()
    stage = CopyStage(torch.device("cpu"), slot_bytes=SLOT, slots=2, lanes=lanes)
    dst = torch.zeros(10000, dtype=torch.bfloat16)  # 5x a slot: it never needed one
    src = torch.randn(10000).bfloat16()
    stage.download(src[:6000], dst[:6000])
    stage.to_host(src[6000:7000], lambda lo, chunk: None)  # a slot download behind it
    stage.download(src[7000:], dst[7000:])
    assert len(stage._ring.free) == 1 and lanes.waited == []
    stage.drain()
    assert lanes.waited == [(False, 3)], "one wait, on the lane's last copy"
    assert torch.equal(dst[:6000], src[:6000]) and torch.equal(dst[7000:], src[7000:])
    assert stage.stats["d2h_bytes"] == 2 * 10000 and stage.stats["copies"] == 3
    assert len(stage._ring.free) == 2
    with pytest.raises(ValueError, match="neither converts nor cuts"):
        stage.download(src, torch.zeros(10000))  # fp32 destination


def test_release_sources_orders_the_compute_stream_after_the_downloads():
    class Recording(HostLanes):
        def __init__(self):
            super().__init__()
            self.n, self.device_waits = 0, []

        def copy(self, dst, src, upload):
            dst.copy_(src)
            self.n += 1
            return self.n

        def device_wait(self, event):
            self.device_waits.append(event)

    lanes = Recording()
    stage = CopyStage(torch.device("cpu"), slot_bytes=SLOT, slots=2, lanes=lanes)
    stage.release_sources()
    assert lanes.device_waits == []  # nothing queued, nothing to wait for
    dst = torch.zeros(100)
    stage.download(torch.ones(100), dst)
    stage.to_host(torch.ones(10), lambda lo, chunk: None)
    stage.release_sources()
    assert lanes.device_waits == [2]  # the last download covers the earlier ones
    stage.release_sources()
    assert lanes.device_waits == [2]
    stage.drain()


def test_the_cpu_twin_times_its_copies_and_the_meter_reports_a_rate():
    from zerostream.offload.copy_stage import CopyMeter
    from zerostream.telemetry import StepTelemetry

    stage = CopyStage(torch.device("cpu"), slot_bytes=1 << 20, slots=2)
    telemetry = StepTelemetry()
    meter = CopyMeter(stage, telemetry)
    src, dst = torch.randn(4 << 20), torch.empty(4 << 20)
    stage.upload(src, dst)
    stage.download(dst, torch.empty_like(dst))
    stage.drain()
    meter.count()
    assert telemetry.bytes == {"h2d": 16 << 20, "d2h": 16 << 20}
    assert all(s > 0 for s in telemetry.tier_seconds.values()), telemetry.tier_seconds
    assert "GB/s" in telemetry.report() and "n/a" not in telemetry.report()


def test_on_a_gpu_the_report_says_which_times_are_the_hosts_issue_time():
    from zerostream.telemetry import StepTelemetry

    for issue_timed in (False, True):
        telemetry = StepTelemetry(issue_timed=issue_timed)
        with telemetry.phase("forward"):
            pass
        telemetry.moved("all_gather", 1 << 20, 0.001)  # host time of issuing a collective
        telemetry.moved("h2d", 1 << 20, 0.001)  # event-timed on the lane: the link's
        telemetry.steps += 1
        line = telemetry.report()
        assert ("host issue time" in line) == issue_timed, line
        assert ("all_gather 1.00 MiB (issued at" in line) == issue_timed, line
        assert "h2d 1.00 MiB (1.05 GB/s)" in line, line
