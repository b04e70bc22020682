"""Device placement of the ZeRO optimizer path on a GPU, checked without one.

The model lives on a fake "cuda" device (torch's FakeTensorMode: shapes, dtypes and devices
without data), so any op mixing a CPU tensor into a CUDA one fails exactly as on a GPU, and
the collectives are replaced by stand-ins that require what NCCL requires: every tensor on
the GPU. The path is driven as the engine drives it (hook per gradient, after_backward,
step) for a pretend world of 2; autograd itself needs a real CUDA context, so the gradients
are handed to the hooks directly. The one host read of the step (the squared norm) is
counted, and returns a fixed value, since fake tensors hold no data.

This is the test that would have caught the GPU data-path issue's stage-1 crash (the
reduce-scatter output was allocated on the CPU) and the norm all-reduce of an offloaded run
running on a CPU tensor.

With the optimizer offloaded, the copy stage's CUDA lanes run against a recording stand-in
for torch.cuda's streams and events (FakeCuda), and every copy between the devices is
watched (CopyAudit): none may be synchronous, each must run on a side stream, the host may
wait once per step for the gradients to land, and the updated weights must be fenced into
the compute stream before the all-gather reads them.
"""

import contextlib
import threading

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from zerostream import comm
from zerostream.config import load
from zerostream.offload import copy_stage
from zerostream.precision import make_loss_scaler
from zerostream.zero import base, grad_reduce
from zerostream.zero.base import ZeroOptimizerBase
from zerostream.zero.factory import build_zero_optimizer, stage_class
from zerostream.zero.protocol import RunState, StageContext, TrainingState

CUDA = torch.device("cuda", 0)


class _Event:
    """An event that completes only when the host waits on it or on one depending on it."""

    def __init__(self, cuda, timing=False):
        self.cuda, self.deps, self.done, self.timing = cuda, set(), False, timing

    def record(self, stream):
        self.deps = set(stream.deps)
        stream.deps.add(self)
        self.cuda.log.append(("record", stream.name))

    def query(self):
        return self.done

    def elapsed_time(self, end):
        """A fixed 2 ms per timed copy; like CUDA, refused unless both events completed."""
        if not (self.timing and end.timing):
            raise RuntimeError("elapsed_time: both events need enable_timing=True")
        if not (self.done and end.done):
            raise RuntimeError("elapsed_time: an event has not completed (cudaErrorNotReady)")
        return 2.0

    def synchronize(self):
        self.cuda.host_syncs += 1
        if threading.get_ident() == self.cuda.main_thread:
            self.cuda.main_thread_syncs += 1
        for e in self.deps | {self}:
            e.done = True


class _Stream:
    def __init__(self, name):
        self.name, self.deps = name, set()

    def wait_stream(self, other):
        self.deps |= other.deps

    def wait_event(self, event):
        self.deps |= event.deps | {event}


class FakeCuda:
    """copy_stage.TorchCuda's calls, recorded: streams carry the set of events their queued
    work depends on, so an event is complete once the host has waited on it or a later one."""

    def __init__(self):
        self.log, self.host_syncs, self.lanes = [], 0, []
        self.main_thread, self.main_thread_syncs = threading.get_ident(), 0
        self.compute = self.current = _Stream("compute")

    def new_stream(self):
        self.lanes.append(_Stream(f"lane{len(self.lanes)}"))
        return self.lanes[-1]

    def current_stream(self):
        return self.compute

    @contextlib.contextmanager
    def use(self, stream):
        before, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = before

    def new_event(self, timing=False, blocking=False):
        return _Event(self, timing)

    def copy(self, dst, src, upload):
        dst.copy_(src, non_blocking=True)  # audited by CopyAudit, on the current stream

    def keep_alive(self, tensor, stream):
        self.log.append(("keep_alive", stream.name))

    def seen_complete(self, event):
        self.log.append(("seen_complete", id(event)))  # no wait: a hint for torch's sanitizer

    def bind_thread(self):
        self.log.append(("bind_thread", threading.current_thread().name))


class CopyAudit(TorchDispatchMode):
    """Every copy between the CPU and the (fake) GPU: synchronous ones, and the stream each
    asynchronous one was queued on."""

    def __init__(self, cuda):
        super().__init__()
        self.cuda, self.sync, self.on_stream = cuda, [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten.copy_.default:
            dst, src = args[0], args[1]
            blocking = not (args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
            if dst.device.type != src.device.type:
                what = f"copy_ {src.device} -> {dst.device} {tuple(src.shape)}"
                self._crossing(blocking, what, src.numel())
        elif func is torch.ops.aten._to_copy.default and kwargs.get("device") is not None:
            if torch.device(kwargs["device"]).type != args[0].device.type:
                blocking = not kwargs.get("non_blocking", False)
                what = f"to {args[0].device} -> {kwargs['device']}"
                self._crossing(blocking, what, args[0].numel())
        return func(*args, **kwargs)

    def _crossing(self, blocking, what, numel):
        if blocking:
            self.sync.append(what)
        else:
            self.on_stream.append((self.cuda.current.name, numel))


def _nccl_like(name, cuda):
    def collective(*tensors, **kwargs):
        for t in tensors:
            if torch.is_tensor(t) and t.device.type != "cuda":
                raise RuntimeError(f"{name}: NCCL needs CUDA tensors; got one on {t.device}")
        if name == "all_gather_into_tensor":
            # It reads what was uploaded (updated partitions, host shards): every upload
            # queued so far must be ordered before it on the stream it is issued from.
            uploads = [e for lane in cuda.lanes[1:] for e in lane.deps]  # lane0 is the download
            missing = [e for e in uploads if e not in cuda.current.deps]
            if missing:
                raise RuntimeError(f"all_gather before {len(missing)} uploads were fenced")
        return None

    return collective


@pytest.fixture
def fake_cuda(monkeypatch):
    cuda = FakeCuda()
    monkeypatch.setattr(copy_stage, "lanes_for", lambda device: copy_stage.CudaLanes(cuda))
    return cuda


class _Reads(list):
    """The step's host reads of the squared norm; `flags`: the late-part flags' reads."""

    flags: list


@pytest.fixture
def gpu_world(monkeypatch, fake_cuda):
    """Two pretend ranks whose collectives insist on CUDA tensors; counts host reads."""
    for name in ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "broadcast"):
        monkeypatch.setattr(comm, name, _nccl_like(name, fake_cuda))
    monkeypatch.setattr(comm, "get_global_rank", lambda group, rank: rank)
    # Rank 0's gradient order, through the store (bucket_order.py), is this rank's own.
    monkeypatch.setattr(comm, "store_broadcast", lambda key, value, group=None: value)
    reads = _Reads()
    monkeypatch.setattr(ZeroOptimizerBase, "_host_scalar", lambda self, t: reads.append(t) or 1.0)
    # The late-part flags of stages 2 and 3 (bucket_order.py), read once a backward: none set.
    flag_reads = []

    def host_flags(flags):
        assert flags.device == CUDA, "the flags are all-reduced on the GPU"
        flag_reads.append(flags)
        return [0.0] * flags.numel()

    monkeypatch.setattr(grad_reduce.ReducerBase, "_host_flags", staticmethod(host_flags))
    reads.flags = flag_reads
    # The host-memory preflight's verdict, all-reduced at setup (on the GPU: the fake NCCL
    # above checks), is read once; nobody is short here.
    monkeypatch.setattr(comm, "_host_int", lambda t: 0)
    # The host gradients' norm kernel reads memory, which fake tensors have none of.
    monkeypatch.setattr(base, "_host_squared_sum", lambda g: g.double().pow(2).sum())
    # The copy stage's consumer thread runs ops on fake tensors beside the main thread; the
    # fake mode keeps "inside a kernel" per mode, not per thread: kept per thread here (a
    # fake tensor read on one thread while the other is inside a kernel reported the meta
    # device, or failed an assertion), and the ops serialized.
    local = threading.local()
    monkeypatch.setattr(
        FakeTensorMode,
        "in_kernel_invocation",
        property(
            lambda self: getattr(local, "inside", False),
            lambda self, value: setattr(local, "inside", value),
        ),
        raising=False,
    )
    lock, dispatch = threading.RLock(), FakeTensorMode.dispatch

    def serialized(self, *args, **kwargs):
        with lock:
            return dispatch(self, *args, **kwargs)

    monkeypatch.setattr(FakeTensorMode, "dispatch", serialized)
    with FakeTensorMode(allow_non_fake_inputs=True):
        yield reads


def _model():
    # Built on the GPU: fake tensors ignore `p.data = ...` device changes, so prepare_module's
    # own .to() cannot be audited here; everything after it is.
    with CUDA:
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _rank1_of_2(config: dict) -> StageContext:
    """Rank 1 of a pretend world of 2 on the fake GPU."""
    cfg = load(config, world_size=2, log=False)
    return StageContext(
        config=cfg,
        group=None,
        rank=1,
        world=2,
        device=CUDA,
        loss_scaler=make_loss_scaler(cfg.fp16),
        run=RunState(),
    )


# offload_optimizer has no effect at stage 0, so stage 0 runs without it.
CASES = [
    (stage, offload, precision)
    for stage in (0, 1, 2)
    for offload in ("none", "cpu")
    for precision in ("fp32", "bf16")
    if stage > 0 or offload == "none"
]


@pytest.mark.parametrize("stage,offload,precision", CASES)
def test_the_optimizer_path_keeps_collectives_on_the_gpu(
    gpu_world, fake_cuda, stage, offload, precision
):
    zero = {"stage": stage, "reduce_bucket_size": 100, "allgather_bucket_size": 64}
    if offload != "none":
        zero["offload_optimizer"] = {"device": offload}
    ctx = _rank1_of_2(
        {
            "train_micro_batch_size_per_gpu": 1,
            "zero_optimization": zero,
            "bf16": {"enabled": precision == "bf16"},
            "zero_force_ds_cpu_optimizer": False,
        }
    )
    model = _model()
    stage_class(stage).prepare_module(model, ctx)
    assert all(p.device == CUDA for p in model.parameters())
    # A client torch optimizer: the fused CPU kernels need real memory, fake tensors have none.
    opt = build_zero_optimizer(
        ctx,
        [{"params": list(model.parameters())}],
        client=lambda groups: torch.optim.AdamW(groups, foreach=False),
    )
    audit = CopyAudit(fake_cuda)
    with audit:
        for _ in range(2):
            ctx.run.state = TrainingState.BACKWARD
            for p in reversed(list(model.parameters())):
                p.grad = torch.ones_like(p)
                if stage > 0:
                    opt._on_grad(p)  # the post-accumulate-grad hook the stage registered
            opt.after_backward()
            ctx.run.state = TrainingState.STEP
            assert opt.step()
            ctx.run.state = TrainingState.IDLE
    assert len(gpu_world) == 2, "one host read per step (the global squared norm)"
    # and, at stage 2, one a backward: which buckets any rank holds late gradient parts of
    assert len(gpu_world.flags) == (2 if stage == 2 else 0)
    assert all(p.device == CUDA for p in model.parameters())
    assert audit.sync == [], "no synchronous copy between the host and the GPU"
    if offload == "none":
        assert audit.on_stream == [] and fake_cuda.host_syncs == 0
        return
    # Gradients went down and weights came up, every copy on a side stream; only the
    # squared-norm scalar, summed on the host, goes up on the compute stream for the
    # all-reduce (once a step).
    stats = opt.copy_stage.stats
    assert stats["d2h_bytes"] > 0 and stats["h2d_bytes"] > 0
    laned = [(s, n) for s, n in audit.on_stream if s != "compute"]
    assert [n for s, n in audit.on_stream if s == "compute"] == [1, 1]
    assert stats["copies"] == len(laned)
    # The copies' events were waited on by the copy stage's consumer thread, which also ran
    # the host-side adds; the thread running backward and the step waited on no event, and
    # for the consumer at most once a step (the drain before the step reads the gradients).
    # The uploads nobody waited for: the all-gather stand-in checked they were fenced into
    # the compute stream.
    assert opt.copy_stage._ring.thread is not None
    assert fake_cuda.host_syncs >= 2 and fake_cuda.main_thread_syncs == 0
    assert stats["host_waits"] <= 2


@pytest.mark.parametrize("stage", [1, 2])
def test_16bit_gradients_download_straight_into_the_host_partitions(
    gpu_world, fake_cuda, monkeypatch, stage
):
    """bf16, accumulation steps 1, the CPU Adam: the gradient partitions are 16-bit host
    memory and each reduced piece is one asynchronous copy on the download lane straight into
    its place (no staging slot, no host-side add); stage 1's accumulator is zeroed only after
    the compute stream was made to wait for its download."""
    zero = {"stage": stage, "reduce_bucket_size": 100, "offload_optimizer": {"device": "cpu"}}
    ctx = _rank1_of_2(
        {
            "train_micro_batch_size_per_gpu": 1,
            "zero_optimization": zero,
            "bf16": {"enabled": True},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        }
    )
    model = _model()
    stage_class(stage).prepare_module(model, ctx)
    opt = build_zero_optimizer(ctx, [{"params": list(model.parameters())}])
    assert [g.dtype for g in opt.grads] == [torch.bfloat16]
    assert opt.grads[0].device.type == "cpu"
    # The kernel reads memory (fake tensors have none); the update's uploads are audited by
    # the test above.
    monkeypatch.setattr(type(opt), "_update_into", lambda self, parts, factor, taken=None: None)
    landed_through_slots = []
    monkeypatch.setattr(opt.reducer.landing, "_landed", lambda *a: landed_through_slots.append(a))
    audit = CopyAudit(fake_cuda)
    with audit:
        ctx.run.state = TrainingState.BACKWARD
        for p in reversed(list(model.parameters())):
            p.grad = torch.ones_like(p)
            opt._on_grad(p)
        opt.after_backward()
        ctx.run.state = TrainingState.STEP
        assert opt.step()
    assert audit.sync == [], "no synchronous copy between the host and the GPU"
    down = fake_cuda.lanes[0]
    laned = [n for s, n in audit.on_stream if s == down.name]
    assert laned and opt.copy_stage.stats["copies"] == len(laned)
    assert opt.copy_stage.stats["d2h_bytes"] == 2 * sum(laned)  # bf16 on the link
    assert landed_through_slots == []
    assert len(opt.copy_stage._ring.free) == copy_stage.SLOTS, "no slot was taken"
    if stage == 1:
        # `local` was zeroed on the compute stream after it waited for the download lane.
        assert down.deps <= fake_cuda.compute.deps
    assert fake_cuda.main_thread_syncs <= 1 and opt.copy_stage.stats["host_waits"] <= 1


def test_stage3_host_shards_cross_on_the_upload_lane_and_prefetches_overlap_compute(
    gpu_world, fake_cuda, monkeypatch
):
    """offload_param cpu: each gather's shards go up on the upload lane, asynchronously, and
    the all-gather is issued after them from that lane; the compute stream waits for a
    prefetch's uploads only when the prefetch is waited on, and the host waits for none
    until it rewrites the shards (the update)."""
    ctx = _rank1_of_2(
        {
            "train_micro_batch_size_per_gpu": 1,
            "zero_optimization": {
                "stage": 3,
                "offload_param": {"device": "cpu"},
                "stage3_param_persistence_threshold": 0,
            },
            "bf16": {"enabled": True},
        }
    )
    model = _model()
    # A GPU machine with offload_param.pin_memory (on by default): the shards are not
    # pinned by torch's allocator (which rounds each up to a power of two and keeps what is
    # freed) but pageable until the first gather homes them in page-locked partitions.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    stage_class(3).prepare_module(model, ctx)
    part = ctx.module_state.part
    assert part.shard_device().type == "cpu" and part.pin_memory
    assert part.summary()["loose_shards"] == 4
    zps = list(part.params.values())
    up = fake_cuda.lanes[1]
    audit = CopyAudit(fake_cuda)
    with audit:
        ahead = part.gather(zps[2:], async_op=True)  # a prefetch of the second layer
        queued = set(up.deps)
        assert queued and not queued & fake_cuda.compute.deps, "compute waits for no prefetch"
        part.gather(zps[:2])  # the first layer, on demand
        assert part.summary()["loose_shards"] == 0 and len(part.host_partitions) == 1
        ahead.wait()
        assert queued <= fake_cuda.compute.deps  # the prefetch's copies, once waited on
        part.release_all()
        part.settle_uploads()
    assert audit.sync == [], "no synchronous copy between the host and the GPU"
    laned = [n for s, n in audit.on_stream if s == up.name]
    assert sum(laned) == sum(zp.shard_numel for zp in zps) and len(laned) == len(zps)
    assert [s for s, _ in audit.on_stream if s != up.name] == []
    assert fake_cuda.main_thread_syncs == 1 and part.uploads.stats["host_waits"] == 1


def test_an_event_seen_complete_is_declared_to_the_stream_sanitizer():
    """TORCH_CUDA_SANITIZER models synchronize() but not query(): an event the host only
    polled leaves the lane's reads unordered before the compute stream's next write to the
    same (reallocated) memory. The H100 run of 2026-11-27 reported exactly that until ready()
    declared what it saw."""
    cuda = FakeCuda()
    lanes = copy_stage.CudaLanes(cuda)
    event = lanes.copy(torch.empty(4), torch.ones(4), upload=False)
    assert not lanes.ready(event)
    assert ("seen_complete", id(event)) not in cuda.log
    event.synchronize()  # the fake completes on a host wait
    assert lanes.ready(event)
    assert cuda.log.count(("seen_complete", id(event))) == 1


def test_lane_copies_are_timed_on_their_lane_and_counted_once_complete():
    """Each copy is bracketed by two timing events on its own lane (the DMA's time, not the
    host's); a copy's seconds reach the telemetry only once it has completed, and once."""
    from zerostream.telemetry import StepTelemetry

    cuda = FakeCuda()
    lanes = copy_stage.CudaLanes(cuda)
    stage = copy_stage.CopyStage(
        torch.device("cpu"), slot_bytes=4096, slots=2, lanes=lanes, consumer_thread=False
    )
    telemetry = StepTelemetry()
    meter = copy_stage.CopyMeter(stage, telemetry)
    stage.upload(torch.ones(3000), torch.zeros(3000))
    stage.upload(torch.ones(500), torch.zeros(500))
    stage.download(torch.ones(1000), torch.zeros(1000))
    down, up = cuda.lanes
    assert [s for kind, s in cuda.log if kind == "record"] == [up.name] * 4 + [down.name] * 2
    meter.count()  # nothing has completed: bytes counted, no seconds yet
    assert telemetry.bytes == {"d2h": 4000, "h2d": 14000}
    assert telemetry.tier_seconds == {"d2h": 0.0, "h2d": 0.0}
    stage.drain()
    meter.count()
    assert telemetry.bytes == {"d2h": 4000, "h2d": 14000}
    assert telemetry.tier_seconds == pytest.approx({"d2h": 0.002, "h2d": 0.004})
    meter.count()  # counted once
    assert telemetry.tier_seconds == pytest.approx({"d2h": 0.002, "h2d": 0.004})
    assert not lanes._timed["h2d"] and not lanes._timed["d2h"]


def test_nvme_staging_returns_to_the_arena_without_a_host_wait(tmp_path):
    """offload_param nvme: the staging buffers a gather's shards were read into are held by
    the copy stage until their uploads complete, not drained per batch (which on a GPU waits
    for everything queued on the compute stream); the host waits for the oldest upload only
    when the staging arena is full."""
    from types import SimpleNamespace

    from zerostream.offload.io_engine import io_config
    from zerostream.zero.stage3.param import ZeroParam
    from zerostream.zero.stage3.param_swap import ParamSwapper

    cuda = FakeCuda()  # an upload completes only once the host has waited on it
    uploads = copy_stage.CopyStage(
        torch.device("cpu"),
        slot_bytes=4096,
        slots=2,
        lanes=copy_stage.CudaLanes(cuda),
        consumer_thread=False,
    )
    offload = SimpleNamespace(
        nvme_path=str(tmp_path), buffer_count=2, buffer_size=2048, max_in_cpu=0, pin_memory=False
    )
    swapper = ParamSwapper(offload, io_config(), rank=0)  # staging: two 4 KiB shards
    values = [torch.randn(1024) for _ in range(5)]
    zps = []
    for i, v in enumerate(values):
        zp = ZeroParam(torch.nn.Parameter(v.clone()), 9000 + i, 1, 0, torch.device("cpu"))
        assert swapper.home(zp, v.clone())  # on disk now
        zps.append(zp)

    def gather(batch):
        send = torch.full((1024 * len(batch),), float("nan"))
        swapper.read_into(batch, send, [1024 * i for i in range(len(batch))], uploads)
        assert torch.equal(send, torch.cat([values[zps.index(zp)] for zp in batch]))

    gather(zps[:2])  # fits the arena: read, uploaded, each buffer held by its upload
    assert cuda.host_syncs == 0 and len(uploads._held) == 2
    gather(zps[2:5])  # three more: the arena is full of held buffers; each waits for one
    assert cuda.host_syncs == 3 and uploads.stats["host_waits"] == 3
    uploads.drain()
    assert not uploads._held and swapper.arena.stats()["in_use"] == 0
