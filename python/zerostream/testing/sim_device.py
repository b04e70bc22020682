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
  copy issued after compute ran ops the lane did not wait for is reported.

  Memory. The device-side tensor of a queued copy is watched: if every tensor the program
  held on its storage is gone before the copy runs and nobody called record_stream
  (keep_alive) for that stream, the caching allocator could have handed the block to the
  next allocation: reported, and the copy's result poisoned. Host ranges registered with
  the device (page-locked) are tracked; an asynchronous copy to or from host memory outside
  them (pageable) is counted, since a GPU runs it synchronously; a registered host buffer
  the program released before the host knew its copy completed (back to its arena, where
  the next read lands in it) is reported. A download's device side is let go once the copy
  ran (record_stream's promise kept). With track_memory, `memory` (sim_memory.py) counts the
  device bytes held and their peak, as torch.cuda.memory_allocated would.

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
  (host_syncs, spin_waits, pageable copies, compute waits) are read by the tests.
"""

from __future__ import annotations

import contextlib
import math
import random
import threading
import time
import weakref
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

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


class _ComputeOps(TorchDispatchMode):
    """Counts the ops the host thread runs while the compute stream is current: the compute
    stream's position, which a lane must wait for before copying."""

    def __init__(self, sim: "SimDevice"):
        super().__init__()
        self.sim = sim

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        sim = self.sim
        internal = sim._local.__dict__.get("internal")
        if not internal and sim.current_stream().host:
            sim.compute_ops += 1
        out = func(*args, **(kwargs or {}))
        if sim.memory is not None and not internal:
            sim.memory.allocated(out)
        return out


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
        }
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

    def synchronize_all(self) -> None:
        """Every lane's queued work completed and observed (torch.cuda.synchronize)."""
        for lane in list(self.lanes):
            self._host_wait(lane, lane.issued, blocking=True)
            self._learn(lane, lane.issued)

    # --- copies ----------------------------------------------------------------------------------
    def copy(self, dst: torch.Tensor, src: torch.Tensor, upload: bool) -> None:
        stream = self.current_stream()
        self._check_thread(stream.device, "copy_(non_blocking=True)")
        if stream.host:
            self._violate("an asynchronous copy was queued on the compute stream, not a lane")
        elif stream.caught_up < self.compute_ops:
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
        freed = self._released(c.device_side, c.key)
        with self.cv:
            kept = any(s is c.stream for s, _ in self.kept.get(c.key, []))
        if freed and not kept:
            self._violate(
                f"a {tuple(c.device_side.shape)} {c.device_side.dtype} device buffer was freed "
                f"while {c.stream.name} still had a copy queued on it, without record_stream: "
                f"the caching allocator may have reused it"
            )
        if c.upload:
            if not torch.equal(c.src, c.snapshot):
                self._violate(
                    f"the host rewrote the source of an upload on {c.stream.name} before "
                    f"the copy ran"
                )
            c.dst.copy_(c.src)
            if freed and not kept:
                _poison(c.dst)
        else:
            c.result = c.src.clone()
            if freed and not kept:
                _poison(c.result)
            # The copy has read its source: record_stream is satisfied and the allocator may
            # hand the block out again, so the sim lets go of its alias (the memory model).
            with self.cv:
                self._drop_alias(c.key)
            c.src = c.device_side = None

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

    def span_registered(self, lo: int, hi: int) -> bool:
        """Whether host bytes [lo, hi) lie in one registered (page-locked) range."""
        with self.cv:
            return any(a <= lo and hi <= b for a, b in self.registered)

    # --- collectives -----------------------------------------------------------------------------
    def collective(self, name: str, fn, args: tuple, kwargs: dict):
        """A tensor collective (Note [The simulated device]): run at issue
        (it reads its inputs then, after the stream it is issued from), and, issued with
        async_op, its outputs hold poison until the program waits for its handle."""
        self.before_collective(name)
        if not kwargs.get("async_op") or name in _UNCOMPARED_P2P:
            self.collective_log.append(("sync", name))
            return fn(*args, **kwargs)
        kwargs = {**kwargs, "async_op": False}
        fn(*args, **kwargs)
        outputs = args[0] if args else kwargs.get("tensor", kwargs.get("tensor_list"))
        outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
        with self.internal():
            results = [t.clone() for t in outputs]
            for t in outputs:
                _poison(t)
        self.collective_log.append(("async", name))
        return SimWork(self, name, outputs, results)

    def before_collective(self, what: str) -> None:
        """A tensor collective: NCCL's stream waits for the current stream, so one issued
        from a lane reads what that lane produced."""
        stream = self.current_stream()
        if stream.host:
            return
        self.count("lane_collectives")
        if stream.caught_up < self.compute_ops:
            self._violate(
                f"{what} was issued from {stream.name} without the lane waiting for the "
                f"compute stream ({self.compute_ops - stream.caught_up} ops queued there since)"
            )
        self._complete(stream, stream.issued)

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


class SimWork:
    """The handle of an asynchronous collective on the simulated device: its outputs hold
    poison until wait(), which puts the results there (the compute stream then waits for
    the collective's stream, as NCCL's Work.wait does). is_completed() follows the policy:
    lazily, never before wait()."""

    def __init__(self, sim: SimDevice, name: str, outputs, results):
        self.sim, self.name = sim, name
        self.outputs, self.results = outputs, results
        self.done = False
        self.due = sim._due()

    def wait(self, timeout=None) -> bool:
        if not self.done:
            with self.sim.internal():
                for t, r in zip(self.outputs, self.results):
                    t.copy_(r)
            self.done = True
            self.outputs = self.results = None
            self.sim.collective_log.append(("wait", self.name))
            self.sim.count("collective_waits")
        return True

    def is_completed(self) -> bool:
        return self.done or (self.sim.policy != "lazy" and time.monotonic() >= self.due)

    def get_future(self):
        raise NotImplementedError("the simulated device's collectives have no futures")


# Point-to-point calls run as issued (a recv's buffer is the program's to wait on).
_UNCOMPARED_P2P = ("send", "recv", "isend", "irecv")

# --- installation --------------------------------------------------------------------------------

_TENSOR_COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "reduce_scatter",
    "reduce",
    "all_to_all_single",
    "all_to_all",
    "gather",
    "scatter",
    "send",
    "recv",
    "isend",
    "irecv",
)
_DEVICE_BOUND = ("all_gather_object", "broadcast_object_list", "barrier", "gather_object")


def _sim_accelerator(sim: SimDevice):
    from ..accelerator import CpuAccelerator

    class SimAccelerator(CpuAccelerator):
        """The CPU accelerator (tensors stay on the CPU) whose set_device is recorded per
        thread by the simulation."""

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
    import torch.distributed as dist

    from .. import accelerator
    from ..offload import host_buffers, lanes

    sim = SimDevice(policy, seed, device_index, max_delay_s)
    if track_memory or device_capacity is not None:
        sim.memory = DeviceMemory(sim)
        sim.memory.capacity = device_capacity
    saved_acc = accelerator._ACCELERATOR
    saved_cuda, saved_observer = lanes.simulated_cuda, host_buffers.registration_observer
    saved = {name: getattr(dist, name) for name in _TENSOR_COLLECTIVES + _DEVICE_BOUND}

    def tensor_collective(name, fn):
        def call(*args, **kwargs):
            return sim.collective(name, fn, args, kwargs)

        return call

    def device_bound(name, fn):
        def call(*args, **kwargs):
            sim.check_rank_device(name)
            return fn(*args, **kwargs)

        return call

    for name in _TENSOR_COLLECTIVES:
        setattr(dist, name, tensor_collective(name, saved[name]))
    for name in _DEVICE_BOUND:
        setattr(dist, name, device_bound(name, saved[name]))
    accelerator._ACCELERATOR = _sim_accelerator(sim)
    lanes.simulated_cuda = lambda device: SimCuda(sim, sim.device_index)
    host_buffers.registration_observer = sim.register
    mode = _ComputeOps(sim)
    failed = True
    try:
        with mode:
            yield sim
        sim.synchronize_all()
        failed = False
    finally:
        if failed:  # let queued work run, so nothing waits on a closed device for good
            try:
                sim.synchronize_all()
            except Exception:  # the block's own error is the one to report
                pass
        lanes.simulated_cuda = saved_cuda
        host_buffers.registration_observer = saved_observer
        accelerator._ACCELERATOR = saved_acc
        for name, fn in saved.items():
            setattr(dist, name, fn)
        sim.close()
    sim.check()


def run_on(fn: Callable, *args, **sim_options):
    """fn(*args) on a SimDevice; returns (fn's result, the device)."""
    with installed(**sim_options) as sim:
        out = fn(*args)
    return out, sim
