"""The simulated device's streams, events and queued copies (Note [The simulated device]
in sim_device.py). Each holds `sim`, the sim_device.SimDevice it belongs to, which keeps
the lock, the policy and the reports."""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from typing import Deque, Optional, Tuple

import torch


def _poison(t: torch.Tensor) -> None:
    if t.is_floating_point() or t.is_complex():
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        t.view(torch.uint8).fill_(0xA5) if t.is_contiguous() else t.fill_(-91)


def _alias(t: torch.Tensor) -> torch.Tensor:
    """A tensor on t's storage that does not keep t (or its view base) alive."""
    return torch.empty((0,), dtype=t.dtype).set_(
        t.untyped_storage(), t.storage_offset(), t.size(), t.stride()
    )


class _Item:
    __slots__ = ("seq", "kind", "due", "copy", "target", "event")

    def __init__(self, seq, kind, due, copy=None, target=None, event=None):
        self.seq, self.kind, self.due = seq, kind, due
        self.copy, self.target, self.event = copy, target, event


class _Copy:
    """One queued copy and what the sim checks about it. Both sides are held through
    aliases only, so that the program's own tensors (and a view's base) can be dropped as
    they would be on a GPU, and the sim sees it: a device buffer back in the caching
    allocator, or a page-locked host buffer back in its arena, while the copy may still run."""

    __slots__ = (
        "dst",
        "src",
        "upload",
        "snapshot",
        "device_side",
        "host_side",
        "key",
        "host_key",
        "result",
        "stream",
        "host_registered",
        "device_bytes",
        "device_snapshot",
    )

    def __init__(self, dst, src, upload, stream):
        device, host = (dst, src) if upload else (src, dst)
        self.device_side, self.host_side = _alias(device), _alias(host)
        self.key = device.untyped_storage().data_ptr()
        self.host_key = host.untyped_storage().data_ptr()
        self.dst = self.device_side if upload else self.host_side
        self.src = self.host_side if upload else self.device_side
        self.upload, self.stream = upload, stream
        self.snapshot = src.clone() if upload else None
        # A storage resized to nothing frees its block (Note [The caching allocator model]);
        # with record_stream a download still reads the block's values of the time.
        self.device_bytes = device.untyped_storage().nbytes()
        self.device_snapshot = None if upload else device.clone()
        self.result = None
        self.host_registered = False  # set by the device at issue


class SimStream:
    """A compute stream (`host`: the host thread) or a lane with a worker thread."""

    def __init__(self, sim, device: int, name: str, host: bool = False):
        self.sim, self.device, self.name, self.host = sim, device, name, host
        self.issued = 0  # seq of the last queued item
        self.completed = 0
        self.forced = 0  # items up to this seq run now, whatever the policy
        self.seen = 0  # the host waited for the items up to this seq
        self.queue: Deque[_Item] = deque()
        self.unobserved: Deque[_Item] = deque()  # completed copies the host has not seen
        self.caught_up = 0  # the compute stream's op count this lane last waited for
        self.caught_up_by: Optional[Tuple[int, int, int]] = None  # who waited (wait_stream)
        # What completing this stream implies about others: (seq here, other, seq there),
        # from its waits; the compute stream keeps its waits by stream (`waited`).
        self.implies: list = []
        self.waited: dict = {}
        self.closed = False
        self.thread = None
        if not host:
            self.thread = threading.Thread(target=self._run, name=f"sim-{name}", daemon=True)
            self.thread.start()

    def __repr__(self) -> str:
        return f"<sim stream {self.name} of cuda:{self.device}>"

    # --- the stream API the copy stage uses ---------------------------------------------------
    def wait_stream(self, other: "SimStream") -> None:
        self.sim._check_thread(self.device, "Stream.wait_stream")
        if other.host:
            self.caught_up = self.sim.compute_ops
            me = threading.get_ident()
            # (thread, its own ops, the position): sim_device._only_other_threads_since
            self.caught_up_by = (me, self.sim.thread_ops.get(me, 0), self.caught_up)
        self._wait_for(other, other.issued)

    def wait_event(self, event: "SimEvent") -> None:
        self.sim._check_thread(self.device, "Stream.wait_event")
        if event.stream is None:
            return
        if event.stream.host:  # ordered after the compute stream's ops up to the record
            self.caught_up = max(self.caught_up, event.ops)
            for other, seq in event.deps.items():
                self._wait_for(other, seq)
        else:
            self._wait_for(event.stream, event.seq)

    def synchronize(self) -> None:
        seq = self.issued
        self.sim._host_wait(self, seq, blocking=True)
        self.sim._learn(self, seq)
        if self.host:  # the compute stream's own copies (Note [The compute pseudo-lane])
            self.sim.compute_lane.land(math.inf)

    def query(self) -> bool:
        if self.host:
            return self.sim._compute_query(self.sim.compute_ops)
        done = self.sim._visible(self, self.issued)
        if done:
            self.sim._learn(self, self.issued)
        return done

    # --- inside --------------------------------------------------------------------------------
    def _wait_for(self, other: "SimStream", seq: int) -> None:
        if other is self or seq <= 0:
            return
        if self.host:  # the host thread is the compute stream: it waits, without observing
            self.sim.count("compute_waits")
            self.sim._complete(other, seq)
            self.waited[other] = max(self.waited.get(other, 0), seq)
            return
        if not other.host:
            at = self.sim._enqueue(self, "wait", target=(other, seq))
            self.implies.append((at, other, seq))

    def _run(self) -> None:
        sim = self.sim
        while True:
            with sim.cv:
                item = None
                while item is None:
                    if self.closed:
                        return
                    timeout = None
                    if self.queue:
                        head = self.queue[0]
                        forced = self.forced >= head.seq
                        if head.kind == "wait":
                            other, seq = head.target
                            if other.completed >= seq:
                                item = head
                                break
                            if forced and other.forced < seq:  # waited for: so is other
                                other.forced = seq
                                sim.cv.notify_all()
                        elif forced or time.monotonic() >= head.due:
                            item = head
                            break
                        elif math.isfinite(head.due):
                            timeout = max(0.0, head.due - time.monotonic())
                    sim.cv.wait(timeout)
            if item.kind == "copy":
                try:
                    sim._execute(item.copy)
                except Exception as exc:  # reported; the stream goes on, or waits would hang
                    sim._violate(f"a copy on {self.name} failed: {exc!r}")
            with sim.cv:
                if item.kind == "record":
                    item.event.done_at = time.perf_counter()
                if item.kind == "copy":
                    self.unobserved.append(item)
                self.queue.popleft()
                self.completed = item.seq
                sim.cv.notify_all()


class SimEvent:
    def __init__(self, sim, timing: bool, blocking: bool):
        self.sim, self.timing, self.blocking = sim, timing, blocking
        self.stream: Optional[SimStream] = None
        self.seq = 0
        self.done_at: Optional[float] = None
        self.ops = 0  # on the compute stream: its op count at the record
        self.deps: dict = {}  # on the compute stream: what it had waited for by then

    def record(self, stream: Optional[SimStream] = None) -> None:
        stream = stream if stream is not None else self.sim.current_stream()
        self.sim._check_thread(stream.device, "Event.record")
        self.stream, self.done_at = stream, None
        if stream.host:
            self.seq, self.done_at = 0, time.perf_counter()
            self.ops, self.deps = self.sim.compute_ops, dict(stream.waited)
        else:
            self.seq = self.sim._enqueue(stream, "record", event=self)

    def query(self) -> bool:
        self.sim._check_thread(self._device(), "Event.query")
        if self.stream is None:
            return True
        if self.stream.host:
            done = self.sim._compute_query(self.ops)
        else:
            done = self.sim._visible(self.stream, self.seq)
        if done:
            self._learned()
        return done

    def synchronize(self) -> None:
        self.sim._check_thread(self._device(), "Event.synchronize")
        if self.stream is not None:
            self.sim._host_wait(self.stream, self.seq, self.blocking)
            self._learned()

    def _learned(self) -> None:
        """The host knows this event completed, and so what it implies: on the compute
        stream, the lane work the compute stream had waited for before the record."""
        if self.stream.host:
            for other, seq in self.deps.items():
                self.sim._learn(other, seq)
            self.sim.compute_lane.land(self.ops)
        else:
            self.sim._learn(self.stream, self.seq)

    def wait(self, stream: Optional[SimStream] = None) -> None:
        (stream if stream is not None else self.sim.current_stream()).wait_event(self)

    def elapsed_time(self, end: "SimEvent") -> float:
        if not (self.timing and end.timing):
            raise RuntimeError("elapsed_time: both events need enable_timing=True")
        if self.done_at is None or end.done_at is None:
            raise RuntimeError("elapsed_time: an event has not completed (cudaErrorNotReady)")
        return (end.done_at - self.done_at) * 1000.0

    def _device(self) -> int:
        return self.stream.device if self.stream is not None else self.sim.device_index
