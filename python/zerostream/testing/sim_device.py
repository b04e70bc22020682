"""A simulated asynchronous CUDA device, for proving the GPU path on a machine without one.

Note [The simulated device]
  On the CPU every copy is finished the moment it is issued, so a missing wait, fence or
  record_stream cannot change a result there. This device behaves like a GPU where a GPU
  punishes such mistakes, while the tensors stay real CPU tensors, so a run on it is
  compared bit for bit with the plain CPU run. It replaces what the copy stage asks of CUDA
  (offload/lanes.TorchCuda: streams, events, copies, record_stream, binding a thread to
  the device), the accelerator's set_device, the host arena's registration and the
  collectives' entry points; everything else runs as on the CPU.

  Streams. Each device has a compute stream, which is the host thread itself (its work is
  done when issued; an op counter stands for its position), and side streams ("lanes"),
  each a FIFO of work run by a thread of its own. A lane's copy or event runs after a delay
  set by the policy: "lazy" (never by itself: only when something waits for it, the most
  adversarial order the program allows), "random" (after a seeded random delay, or when
  waited for), "eager" (at once). A stream's wait on another is a queue entry that holds
  the stream until the other reaches that point.

  Copies. At issue the destination is poisoned (NaN, or a byte pattern) and an upload's
  host source is snapshot. When a copy runs, it reads its source then; a download's values
  reach its host destination only when the host learns that the copy completed (an event's
  synchronize or a query that returns True, here called observing it), since before that
  the host may not assume anything about them. An upload whose host source changed between
  issue and the host observing its completion is reported (the host rewrote memory a DMA
  may still read).

  Waits. The compute stream waiting for an event (wait_event, wait_stream) blocks the host
  until it completes, but is not an observation: the host still knows nothing, and under
  the lazy policy a query keeps answering "not ready" until the host itself waited for
  that point (a GPU may be that slow; only code that falls back to a blocking wait works).
  A collective issued while a lane is current runs after that lane's queued work (NCCL's
  stream waits for the current one). Each copy must be preceded by its lane waiting for
  the compute stream at its current position (the copy reads what compute produced): a
  copy issued after compute ran ops the lane did not wait for is reported. Ops another
  host thread queued on the compute stream after the copying thread's own wait are not
  counted: on a GPU they are unordered with the copy as well, and a second thread's copies
  (an update behind the forward, zero/overlap.py) are ordered against the first thread's
  work by that thread's waits on their marks.

  Memory. The device-side tensor of a queued copy is watched: if every tensor the program
  held on its storage is gone before the copy runs and nobody called record_stream
  (keep_alive) for that stream, the caching allocator could have handed the block to the
  next allocation: reported, and the copy's result poisoned. Host ranges registered with
  the device (page-locked) are tracked; an asynchronous copy to or from host memory outside
  them (pageable) is counted, since a GPU runs it synchronously; a registered host buffer
  the program released before the host knew its copy completed (back to its arena, where
  the next read lands in it) is reported. A download's device side is let go once the copy
  ran (record_stream's promise kept); a storage resized to nothing under a queued copy is
  freed too, and a block freed by the stream it was made on needs no record_stream. With
  track_memory, `memory` (sim_memory.py, Note [The caching allocator model]) counts the
  device bytes held and their peak, as torch.cuda.memory_allocated would, and what the
  caching allocator keeps reserved, per allocation stream, until empty_cache.

  The compute stream (sim_compute.py). Which storages are device memory is known from the
  device's name (Note [Device memory on the simulated device]); a non_blocking copy between
  them and page-locked host memory on the compute stream is pending until the host
  synchronizes with the stream (Note [The compute pseudo-lane]); a blocking read of device
  memory by the host (`.item()`, `.cpu()`) is such a synchronization, counted with the line
  that made it.

  Collectives. A tensor collective runs when issued (it reads its inputs then, after the
  work queued on the stream it is issued from). Issued with async_op, its outputs hold
  poison (NaN) until the program waits for its handle, whose is_completed() follows the
  policy (lazily: never before wait); so a bucket landed, or a gathered parameter read,
  before its wait is visibly wrong, as a GPU may make it. `collective_log` keeps the
  issues and waits in order: how tests see whether the compute stream waited for a
  collective inside backward. A real device's collective runs on NCCL's stream after its
  issue; the sim cannot see a write to an input after issue (it already read it).

  Threads. Each thread has its own current device (set_device). A CUDA call from a thread
  whose current device is not the stream's device (a thread that never set one is on
  device 0, where the runtime would create a context) is reported, and so are object
  collectives and barriers run while the thread's current device is not the rank's.

  Violations are collected and raised by check() (and at uninstall); the counters
  (host_syncs, spin_waits, pageable copies, compute waits, host reads, registrations) are
  read by the tests, per step through step_budget.StepCounters.

  What it still cannot see: timing (a copy's speed, whether a collective really overlapped
  compute on the wire: only the order of issues and waits), a write to a collective's input
  after its issue (the collective already read it), kernels that race within one stream,
  the caching allocator's block sizes and fragmentation (bytes only), host memory a native
  library reads without torch (the io_uring and AIO buffers are checked by their own
  tests), a device tensor made by an op that names neither the device nor a device
  input (torch.empty_like of a host tensor, say), and the torch ops of threads other than
  the one that installed it (dispatch modes are thread-local: a second thread's copies
  and waits, which go through the lanes, are seen; its ops on device tensors are not; the
  update behind the forward runs only host ops and lane copies there).
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import sys
import threading
import time
import weakref
from collections import Counter
from typing import Callable, Dict, List, Optional, Tuple

import torch

from . import sim_collectives
from .sim_compute import ComputeLane, ComputeOps, DeviceTags, HostReads
from .sim_memory import DeviceMemory
from .sim_streams import SimEvent, SimStream, _Copy, _Item, _poison

POLICIES = ("lazy", "random", "eager")


class SimCuda:
    """lanes.TorchCuda's interface for one device of the simulation."""

    def __init__(self, sim: "SimDevice", index: int):
        self.sim, self.index = sim, index
        self.device = torch.device("cpu")  # where the tensors really are

    def new_stream(self) -> SimStream:
        self.sim._check_thread(self.index, "Stream()")
        return self.sim.new_lane(self.index)

    def current_stream(self) -> SimStream:
        return self.sim.current_stream(self.index)

    def use(self, stream: SimStream):
        return self.sim.use(stream)

    def new_event(self, timing: bool = False, blocking: bool = False) -> SimEvent:
        return SimEvent(self.sim, timing, blocking)

    def copy(self, dst: torch.Tensor, src: torch.Tensor, upload: bool) -> None:
        self.sim.copy(dst, src, upload)

    def keep_alive(self, tensor: torch.Tensor, stream: SimStream) -> None:
        self.sim.keep_alive(tensor, stream)

    def seen_complete(self, event: SimEvent) -> None:
        """Only torch's stream sanitizer needs telling (see TorchCuda.seen_complete)."""

    def bind_thread(self) -> None:
        self.sim.set_device(self.index)


class SimDevice:
    """See Note [The simulated device]. `device_index`: this process's device (the rank's
    LOCAL_RANK in a multi-rank test, so that work bound to device 0 by mistake shows)."""

    def __init__(
        self,
        policy: str = "lazy",
        seed: int = 0,
        device_index: int = 0,
        max_delay_s: float = 0.002,
    ):
        if policy not in POLICIES:
            raise ValueError(f"sim device policy: expected one of {POLICIES}; got {policy!r}")
        self.policy, self.device_index, self.max_delay_s = policy, device_index, max_delay_s
        # What the engine names this device (accelerator.bind_run_device): a CPU device with
        # an index, so that what is made on it is told from host memory (Note [Device memory
        # on the simulated device])
        self.torch_device = torch.device("cpu", device_index)
        self.rng = random.Random(seed)
        self.cv = threading.Condition(threading.RLock())
        self._local = threading.local()
        self.compute: Dict[int, SimStream] = {}
        self.lanes: List[SimStream] = []
        self.thread_devices: Dict[int, int] = {}
        self.set_device_calls: List[Tuple[str, int]] = []
        self.registered: List[Tuple[int, int]] = []
        self.kept: Dict[int, List[Tuple[SimStream, int]]] = {}
        self.live_aliases: Dict[int, int] = {}
        self.compute_ops = 0
        self.thread_ops: Dict[int, int] = {}  # compute ops per host thread (its ident)
        # ("sync" | "async" | "wait", collective): the order the program issued and waited
        # for its collectives in (Note [The simulated device])
        self.collective_log: List[Tuple[str, str]] = []
        self.memory: Optional[DeviceMemory] = None  # installed(track_memory=True)
        self.violations: List[str] = []
        self.counters = {
            "copies": 0,
            "host_syncs": 0,
            "main_thread_syncs": 0,
            "spin_waits": 0,
            "compute_waits": 0,
            "pageable_copies": 0,
            "lane_collectives": 0,
            "empty_cache": 0,
            "collective_waits": 0,
            "host_reads": 0,
            "blocking_downloads": 0,
            "compute_lane_copies": 0,
            "registrations": 0,
        }
        self.compute_lane = ComputeLane(self)  # Note [The compute pseudo-lane]
        self.tags = DeviceTags()  # Note [Device memory on the simulated device]
        self.read_sites: Counter = Counter()  # "file:line function" of each host read
        self.main_thread = threading.get_ident()

    # --- devices and threads ---------------------------------------------------------------------
    def set_device(self, index: int) -> None:
        self.thread_devices[threading.get_ident()] = index
        self.set_device_calls.append((threading.current_thread().name, index))

    def current_device(self) -> int:
        return self.thread_devices.get(threading.get_ident(), 0)

    def _check_thread(self, device: int, what: str) -> None:
        ident = threading.get_ident()
        current = self.thread_devices.get(ident)
        if current != device:
            name = threading.current_thread().name
            why = (
                "it never set one, so the CUDA runtime would create a context on cuda:0"
                if current is None
                else f"its current device is cuda:{current}"
            )
            self._violate(f"thread {name!r} called {what} for cuda:{device}, but {why}")

    def check_rank_device(self, what: str) -> None:
        """An object collective or barrier: NCCL runs it on the thread's current device."""
        current = self.current_device()
        if current != self.device_index:
            self._violate(
                f"{what} ran with the current device cuda:{current}, not this rank's "
                f"cuda:{self.device_index}: NCCL would put its bytes on cuda:{current}"
            )

    # --- streams ---------------------------------------------------------------------------------
    def compute_stream(self, index: int) -> SimStream:
        if index not in self.compute:
            self.compute[index] = SimStream(self, index, f"compute{index}", host=True)
        return self.compute[index]

    def new_lane(self, index: int) -> SimStream:
        lane = SimStream(self, index, f"lane{len(self.lanes)}")
        self.lanes.append(lane)
        return lane

    def current_stream(self, index: Optional[int] = None) -> SimStream:
        index = self.device_index if index is None else index
        stack = self._local.__dict__.setdefault("streams", {}).get(index)
        return stack[-1] if stack else self.compute_stream(index)

    @contextlib.contextmanager
    def use(self, stream: SimStream):
        stacks = self._local.__dict__.setdefault("streams", {})
        stacks.setdefault(stream.device, []).append(stream)
        try:
            yield stream
        finally:
            stacks[stream.device].pop()

    def _due(self) -> float:
        if self.policy == "lazy":
            return math.inf
        if self.policy == "eager":
            return 0.0
        return time.monotonic() + self.rng.random() * self.max_delay_s

    def _enqueue(self, stream: SimStream, kind: str, **fields) -> int:
        with self.cv:
            stream.issued += 1
            stream.queue.append(_Item(stream.issued, kind, self._due(), **fields))
            self.cv.notify_all()
            return stream.issued

    def count(self, counter: str) -> None:
        with self.cv:
            self.counters[counter] += 1

    def _complete(self, stream: SimStream, seq: int) -> None:
        """Runs `stream` up to `seq` (forcing it past the policy) and waits for it; at once
        once the device is closed (a finalizer after uninstall must not hang)."""
        with self.cv:
            stream.forced = max(stream.forced, seq)
            self.cv.notify_all()
            self.cv.wait_for(lambda: stream.completed >= seq or stream.closed)

    def _host_wait(self, stream: SimStream, seq: int, blocking: bool) -> None:
        """The host blocks until `stream` reached `seq` (the caller then learns what that
        implies)."""
        with self.cv:
            self.counters["host_syncs"] += 1
            if threading.get_ident() == self.main_thread:
                self.counters["main_thread_syncs"] += 1
            if not stream.host and not self._visible(stream, seq) and not blocking:
                self.counters["spin_waits"] += 1
        self._complete(stream, seq)

    def host_read(self, t: torch.Tensor, scalar: bool) -> None:
        """The host read device memory (Note [The compute pseudo-lane]): it waited for the
        compute stream to get there."""
        self.count("host_reads")
        if not scalar:
            self.count("blocking_downloads")
        self.read_sites[_caller()] += 1
        self.compute_lane.land(math.inf)

    def _learn(self, stream: SimStream, seq: int) -> None:
        """The host knows `stream` completed up to `seq`, and so whatever that stream had
        waited for by then (a lane's waits on other lanes)."""
        if stream.host or stream.seen >= seq:
            return
        with self.cv:
            stream.seen = max(stream.seen, seq)
            implied = [(other, s) for at, other, s in stream.implies if at <= seq]
        self._observe(stream, seq)
        for other, s in implied:
            self._learn(other, s)

    def _visible(self, stream: SimStream, seq: int) -> bool:
        """Whether a query finds `stream` complete up to `seq`. Lazily, only what the host
        waited for: work the compute stream waited for ran, but a GPU may not have got
        there yet when the host asks, and nothing may depend on its having done so."""
        if self.policy == "lazy":
            return stream.seen >= seq
        return stream.completed >= seq

    def _compute_query(self, ops: int) -> bool:
        """Whether a query finds the compute stream past op `ops`: its ops ran when issued,
        but lazily a non_blocking copy queued on it (Note [The compute pseudo-lane]) is not
        done until the host synchronized with it."""
        if self.policy == "lazy" and self.compute_lane.has_pending(ops):
            return False
        self.compute_lane.land(ops)
        return True

    def synchronize_all(self) -> None:
        """Every lane's queued work completed and observed (torch.cuda.synchronize)."""
        self.compute_lane.land(math.inf)
        for lane in list(self.lanes):
            self._host_wait(lane, lane.issued, blocking=True)
            self._learn(lane, lane.issued)

    # --- copies ----------------------------------------------------------------------------------
    def _only_other_threads_since(self, lane: SimStream) -> bool:
        """Whether every compute op queued since `lane` last waited for the compute stream
        came from other host threads than this one, which waited itself: on a GPU those
        ops are not ordered before the copy either, and a copy from a second thread (an
        update behind the forward) needs only what its own thread queued before (Note [The
        simulated device], Streams)."""
        me = threading.get_ident()
        by = lane.caught_up_by
        return (
            by is not None
            and by[0] == me
            and by[2] == lane.caught_up
            and self.thread_ops.get(me, 0) == by[1]
        )

    def copy(self, dst: torch.Tensor, src: torch.Tensor, upload: bool) -> None:
        stream = self.current_stream()
        self._check_thread(stream.device, "copy_(non_blocking=True)")
        if stream.host:
            self._violate("an asynchronous copy was queued on the compute stream, not a lane")
        elif stream.caught_up < self.compute_ops and not self._only_other_threads_since(stream):
            self._violate(
                f"a copy on {stream.name} was queued without the lane waiting for the compute "
                f"stream ({self.compute_ops - stream.caught_up} ops queued there since)"
            )
        if dst.numel() != src.numel():
            raise RuntimeError(f"sim copy: {src.numel()} elements into {dst.numel()}")
        host = src if upload else dst
        registered = self._registered(host)
        if not registered:
            self.count("pageable_copies")
        with self.internal():
            item = _Copy(dst, src, upload, stream)
            item.host_registered = registered
            _poison(dst)
        with self.cv:
            for key in (item.key, item.host_key):
                self.live_aliases[key] = self.live_aliases.get(key, 0) + 1
            self.counters["copies"] += 1
        self._enqueue(stream, "copy", copy=item)

    def _released(self, side: torch.Tensor, key: int) -> bool:
        """Whether the program holds no tensor on `side`'s storage any more: only the
        sim's aliases (one per queued copy of it) and the storage object are left."""
        with self.cv:
            storage = side.untyped_storage()
            users = torch._C._storage_Use_Count(storage._cdata)
            del storage
            return users <= self.live_aliases.get(key, 0) + 1

    def _execute(self, c: _Copy) -> None:
        """On the lane's thread: the copy reads its source now."""
        storage = c.device_side.untyped_storage()
        resized = storage.data_ptr() != c.key or storage.nbytes() < c.device_bytes
        freed = resized or self._released(c.device_side, c.key)
        with self.cv:
            kept = any(s is c.stream for s, _ in self.kept.get(c.key, []))
        # Freed by the stream it was made on, a block is reused only by that stream's later
        # work (Note [The caching allocator model])
        own = self.memory is not None and self.memory.stream_of(storage) is c.stream
        del storage
        if freed and not kept and not own:
            how = " (its storage resized to nothing)" if resized else ""
            self._violate(
                f"a {tuple(c.device_side.shape)} {c.device_side.dtype} device buffer was freed"
                f"{how} while {c.stream.name} still had a copy queued on it, without "
                f"record_stream: the caching allocator may have reused it"
            )
        safe = not freed or kept or own
        if c.upload:
            if not torch.equal(c.src, c.snapshot):
                self._violate(
                    f"the host rewrote the source of an upload on {c.stream.name} before "
                    f"the copy ran"
                )
            if not resized:  # else its storage holds other data now, or none
                c.dst.copy_(c.src)
                if not safe:
                    _poison(c.dst)
        else:
            if resized:  # the block, kept by record_stream, still holds the old values
                c.result = c.device_snapshot.clone()
            else:
                c.result = c.src.clone()
            if not safe:
                _poison(c.result)
            # The copy has read its source: record_stream is satisfied and the allocator may
            # hand the block out again, so the sim lets go of its alias (the memory model).
            with self.cv:
                self._drop_alias(c.key)
            c.src = c.device_side = c.device_snapshot = None

    def _observe(self, stream: SimStream, seq: int) -> None:
        """The host learned that `stream` completed up to `seq`."""
        with self.cv:
            while stream.unobserved and stream.unobserved[0].seq <= seq:
                c = stream.unobserved.popleft().copy
                with self.internal():
                    if c.upload:
                        if not torch.equal(c.src, c.snapshot):
                            self._violate(
                                f"the host rewrote the source of an upload on {stream.name} "
                                f"before it knew the copy had completed"
                            )
                    else:
                        c.dst.copy_(c.result)
                if c.host_registered and self._released(c.host_side, c.host_key):
                    self._violate(
                        f"a page-locked host buffer ({tuple(c.host_side.shape)} "
                        f"{c.host_side.dtype}) was released to its arena while a copy on "
                        f"{stream.name} still used it, before the host knew it had completed"
                    )
                for key in (c.key, c.host_key) if c.upload else (c.host_key,):
                    self._drop_alias(key)

    def _drop_alias(self, key: int) -> None:
        n = self.live_aliases.get(key, 1) - 1
        if n:
            self.live_aliases[key] = n
        else:
            self.live_aliases.pop(key, None)
            self.kept.pop(key, None)

    def keep_alive(self, tensor: torch.Tensor, stream: SimStream) -> None:
        with self.cv:
            key = tensor.untyped_storage().data_ptr()
            if key in self.live_aliases:  # else the copies on it ran already: nothing to keep
                self.kept.setdefault(key, []).append((stream, stream.issued))

    # --- host memory ---------------------------------------------------------------------------
    def register(self, tensor: torch.Tensor) -> None:
        """Page-locked and registered with the device (the host arena's cudaHostRegister),
        until the program drops the buffer (`tensor` and every view of it)."""
        lo = tensor.data_ptr()
        span = (lo, lo + tensor.numel() * tensor.element_size())
        with self.cv:
            self.registered.append(span)
            self.counters["registrations"] += 1
        if self.memory is not None:  # counted by the ops that cut it out, before this call
            self.memory.forget(*span)
        weakref.finalize(tensor, self._unregister, span)

    def _unregister(self, span: Tuple[int, int]) -> None:
        with self.cv:
            if span in self.registered:
                self.registered.remove(span)

    def _registered(self, t: torch.Tensor) -> bool:
        lo = t.data_ptr()
        return self.span_registered(lo, lo + t.numel() * t.element_size())

    def on_device(self, t: torch.Tensor) -> bool:
        """Whether `t` is device memory (Note [Device memory on the simulated device])."""
        return self.tags.has(t) and not self._registered(t)

    def span_registered(self, lo: int, hi: int) -> bool:
        """Whether host bytes [lo, hi) lie in one registered (page-locked) range."""
        with self.cv:
            return any(a <= lo and hi <= b for a, b in self.registered)

    # --- reporting -------------------------------------------------------------------------------
    def _violate(self, what: str) -> None:
        with self.cv:
            if what not in self.violations:
                self.violations.append(what)

    def check(self) -> None:
        if self.violations:
            raise AssertionError(
                "the simulated device saw "
                + "; ".join(self.violations[:10])
                + (f" (and {len(self.violations) - 10} more)" if len(self.violations) > 10 else "")
            )

    @contextlib.contextmanager
    def internal(self):
        """The simulation's own tensor ops: not the program's compute stream."""
        before = self._local.__dict__.get("internal", False)
        self._local.internal = True
        try:
            yield
        finally:
            self._local.internal = before

    def close(self) -> None:
        with self.cv:
            for lane in self.lanes:
                lane.closed = True
            self.cv.notify_all()
        for lane in self.lanes:
            lane.thread.join(timeout=5)


def _caller() -> str:
    """The innermost frame outside torch and the simulation: where a host read was made."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if os.sep + "torch" + os.sep not in path and os.sep + "testing" + os.sep not in path:
            return f"{os.path.basename(path)}:{frame.f_lineno} {frame.f_code.co_name}"
        frame = frame.f_back
    return "?"


def _sim_accelerator(sim: SimDevice):
    from ..accelerator import CpuAccelerator

    class SimAccelerator(CpuAccelerator):
        """The CPU accelerator (tensors stay on the CPU) whose set_device is recorded per
        thread by the simulation."""

        simulated = True

        def set_device(self, device_index: int) -> None:
            sim.set_device(int(device_index))

        def current_device(self) -> int:
            return sim.current_device()

        def synchronize(self, device_index: Optional[int] = None) -> None:
            sim.synchronize_all()

        def memory_room(self):
            """From the memory model when it has a capacity; else None, as on the CPU."""
            mem = sim.memory
            return mem.room() if mem is not None and mem.capacity is not None else None

        def reset_memory_peak(self) -> None:
            if sim.memory is not None:
                sim.memory.reset_peak()

        def empty_cache(self) -> None:
            sim.count("empty_cache")
            if sim.memory is not None:
                sim.memory.empty_cache()

    return SimAccelerator()


_ACTIVE: Optional[SimDevice] = None


def active() -> Optional[SimDevice]:
    """The SimDevice installed now, or None (the plain CPU, or a real GPU)."""
    return _ACTIVE


@contextlib.contextmanager
def installed(
    policy: str = "lazy",
    seed: int = 0,
    device_index: int = 0,
    max_delay_s: float = 0.002,
    track_memory: bool = False,
    device_capacity: Optional[int] = None,
):
    """Runs the block with the engine's CUDA path on a SimDevice (yielded); raises its
    violations at the end. `track_memory`: its `memory` counts device bytes (sim_memory.py);
    `device_capacity` (bytes, implies track_memory): holding more is a violation, and the
    accelerator's memory_room() reports what is left of it."""
    from .. import accelerator
    from ..offload import host_buffers, lanes

    global _ACTIVE
    sim = SimDevice(policy, seed, device_index, max_delay_s)
    if track_memory or device_capacity is not None:
        sim.memory = DeviceMemory(sim)
        sim.memory.capacity = device_capacity
    saved_acc = accelerator._ACCELERATOR
    saved_cuda, saved_observer = lanes.simulated_cuda, host_buffers.registration_observer
    restore_collectives = sim_collectives.install(sim)
    accelerator._ACCELERATOR = _sim_accelerator(sim)
    lanes.simulated_cuda = lambda device: SimCuda(sim, sim.device_index)
    host_buffers.registration_observer = sim.register
    failed = True
    saved_active, _ACTIVE = _ACTIVE, sim
    try:
        with HostReads(sim), ComputeOps(sim):
            yield sim
        sim.synchronize_all()
        failed = False
    finally:
        if failed:  # let queued work run, so nothing waits on a closed device for good
            try:
                sim.synchronize_all()
            except Exception:  # the block's own error is the one to report
                pass
        _ACTIVE = saved_active
        lanes.simulated_cuda = saved_cuda
        host_buffers.registration_observer = saved_observer
        accelerator._ACCELERATOR = saved_acc
        restore_collectives()
        sim.close()
    sim.check()


def run_on(fn: Callable, *args, **sim_options):
    """fn(*args) on a SimDevice; returns (fn's result, the device)."""
    with installed(**sim_options) as sim:
        out = fn(*args)
    return out, sim
