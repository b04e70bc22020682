"""The device<->host copy stage (DESIGN.md §1 and §4): the bytes the offloaded optimizer path
moves between the accelerator and host memory go through here, asynchronously.

Note [The copy stage]
  Two lanes, one per direction; on a GPU each is a dedicated stream. A copy is queued on its
  lane after the work already queued on the compute stream (so it reads finished values),
  through page-locked staging: a ring of `slots` buffers of `slot_bytes` taken once from a
  HostArena (mlock'ed and cudaHostRegister'ed), so the DMA never takes the pageable path
  (18.8 GB/s on the H100 box against 53 GB/s pinned, issue 11). An event recorded after each
  copy orders the reuse of its slot: the host waits on it only when it needs that slot again,
  a ring's worth of copies later, or at drain().

  Downloads (device -> host): to_host(src, consume) cuts src into slot-sized chunks; each
  lands in a slot, and consume(offset, chunk) runs on the host once it has, at the latest at
  drain(), in the order queued. The lane keeps src alive until its copy ran (record_stream),
  so the caller may drop it at once. src keeps its dtype: 16-bit gradients cross the link
  as 16 bits and are widened on the host by whoever consumes them. download(src, dst) needs
  no slot: it copies straight into page-locked host memory of src's dtype (a 16-bit gradient
  partition in the host arena), which nobody reads before drain(); no host pass at all.
  release_sources() makes the compute stream wait, on the device, for the downloads queued
  so far, so it may overwrite their sources (stage 1 zeroes its accumulator next).

  Uploads (host -> device): staging(numel, dtype) hands out a slot for the host to write
  (the fused CPU optimizer writes its 16-bit copy there) and commit(dst) queues its copy into
  dst; upload(src, dst) copies straight from memory that is already page-locked (the host
  arena). The compute stream waits for the uploads at fence(), on the device: the host does
  not wait, and the CPU goes on with the next piece while the last one crosses.

  On a GPU the downloads are landed by a consumer thread of the stage's own: it waits for
  each copy's event in queue order, runs its consumer (the host-side add of 16-bit gradients
  into the fp32 partitions) and frees the slot, so the thread that queues them, autograd's
  during backward, goes on queuing the next buckets' kernels and waits only when every slot
  is taken. On the CPU twin they are landed inline, when their slot is needed again or at
  drain(): there the consumer thread's adds, a second OpenMP team on the same cores, slowed
  the whole step (bench step, small, stage 2 offload cpu bf16: 0.076-0.092 s against
  0.064-0.070 s inline); tests turn it on explicitly.

  Stage 3 with shards in host memory (offload_param cpu or nvme) has an upload-only stage of
  its own (zero/stage3/partitioner.py): a gather uploads its shards on the lane and issues
  its all-gather from the lane (after_uploads), so a prefetch's copies and collective follow
  the uploads without the compute stream waiting for them until the gather is waited on;
  the host waits for the lane (drain) only before it rewrites shards. NVMe staging buffers
  an upload reads from stay with the stage until a later look finds their upload complete
  (release_held, Note [Host memory of a copy in flight]), so they return to the staging
  arena without the host waiting; the swapper waits for the oldest only when the arena is
  full.

  The CPU twin (HostLanes) keeps the same slots, chunking, ordering and deferred consumers,
  with memcpy for the copies and events that are always complete, so the CPU tests run the
  code a GPU runs; CudaLanes adds only the streams and events. `stats` counts the bytes each
  way and every time the host waited on a copy (`host_waits`): the audit test holds a step to
  its budget of those.

  Note [Host memory of a copy in flight]
    Page-locked host memory that a queued copy reads or writes must stay allocated until the
    host knows the copy completed: an arena's buffer released earlier goes back to its pool
    (the next disk read lands in it while the DMA still reads it) or is unmapped. So the
    stage keeps every direct upload's source (release_held() drops those whose uploads it
    finds complete, in order; the parameter swapper returns NVMe staging this way without
    waiting) and every direct download's destination until drain(). A stage dropped with
    copies not known complete (an engine collected mid-step) hands that memory, and its
    slots, to a list that a later drain() of any stage releases once they completed: its
    finalizer may run on any thread, so it neither waits nor asks the device.
    engine.destroy() drains its stages first. The simulated device reports a buffer the
    program released too early.

  Each lane also times its copies (busy_seconds(), per direction): on a GPU from a timing
  event recorded before each copy to the one after it, on the lane itself, so the time is
  the DMA's and not the host's (a copy that waits on the lane for the compute stream starts
  its clock when it starts to move), summed as copies complete; on the CPU twin the memcpy's
  wall time. CopyMeter hands bytes and busy seconds to the step telemetry's d2h/h2d tiers, so
  bench step and steps_per_print show the link's achieved GB/s, not only its bytes.
"""

from __future__ import annotations

import atexit
import functools
import threading
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Callable, Deque, Dict, Optional

import torch

from .. import sizing
from .lanes import CudaLanes, HostLanes, TorchCuda, lanes_for  # noqa: F401 (re-exported)
from .sinks import StagedSink

SLOT_BYTES = sizing.COPY_SLOT_BYTES
SLOTS = sizing.COPY_SLOTS


class _Tail:
    """The last upload and download a stage queued since its drain (shared with the stage's
    finalizer, which must not hold the stage)."""

    __slots__ = ("up", "down")

    def __init__(self):
        self.up = self.down = None


# Host memory of dropped stages' copies that were not known complete, with the events that
# say when it may go: released by a later drain() of any stage (Note [Host memory of a copy
# in flight]). A finalizer may run on any thread (a garbage collection anywhere), so it never
# waits or queries the device itself.
_ORPHANS: "Deque[tuple]" = deque()
_ORPHANS_LOCK = threading.Lock()


def _orphan(lanes, tail: _Tail, held: Deque[tuple], landing: list, slots: list) -> None:
    """A stage was dropped: its copies' host memory waits for them in _ORPHANS."""
    events = [e for e in (tail.down, tail.up) if e is not None]
    if events:
        with _ORPHANS_LOCK:
            _ORPHANS.append((lanes, events, list(held), list(landing), list(slots)))


def _release_orphans() -> None:
    """Lets go of the host memory of dropped stages whose last copies completed."""
    with _ORPHANS_LOCK:
        pending = list(_ORPHANS)
        _ORPHANS.clear()
    keep = [o for o in pending if not all(o[0].ready(e) for e in o[1])]
    if keep:
        with _ORPHANS_LOCK:
            _ORPHANS.extendleft(reversed(keep))


@dataclass
class _InFlight:
    slot: int
    event: object
    consume: Optional[Callable[[], None]]  # downloads: runs once the copy has landed


@dataclass
class Staged:
    """A slot handed out by CopyStage.staging(): write `host`, then commit(staged, dst)."""

    slot: int
    host: torch.Tensor


class _Ring:
    """The free slots and the downloads in flight, shared with the consumer thread (which
    holds this, not the stage, so a dropped stage is collected and its thread ends)."""

    def __init__(self, slots: int, lanes):
        self.lanes = lanes
        self.cv = threading.Condition()
        self.free: Deque[int] = deque(range(slots))
        self.downs: Deque[_InFlight] = deque()  # queued, not yet consumed, queue order
        self.busy = 0  # downloads queued or being consumed
        self.error: Optional[BaseException] = None
        self.thread: Optional[threading.Thread] = None

    def land(self, f: _InFlight, count=None) -> None:
        """Waits for f's copy (counting the wait in `count`), runs its consumer, frees its
        slot. After a consumer failed, the rest are only freed."""
        if self.error is None:
            try:
                if not self.lanes.ready(f.event):
                    if count is not None:
                        count["host_waits"] += 1
                    self.lanes.host_wait(f.event)
                if f.consume is not None:
                    f.consume()
            except BaseException as e:  # handed to the thread that drains
                self.error = e
        with self.cv:
            self.free.append(f.slot)
            self.cv.notify_all()

    def run(self) -> None:
        """The consumer thread: lands downloads in queue order; None ends it."""
        self.lanes.bind_thread()  # its event waits are CUDA calls: on this rank's device
        while True:
            with self.cv:
                self.cv.wait_for(lambda: self.downs)
                f = self.downs[0]
            if f is None:
                return
            self.land(f)
            with self.cv:
                self.downs.popleft()
                self.busy -= 1
                self.cv.notify_all()

    def stop(self) -> None:
        with self.cv:
            self.downs.append(None)
            self.cv.notify_all()


# Consumer threads still running at interpreter exit (a stage kept alive by an engine's
# reference cycles) are stopped and joined first: a daemon thread woken during finalization
# is torn down inside torch's C++ frames, which aborts the process ("terminate called
# without an active exception") after the run has finished.
_LIVE_RINGS: "weakref.WeakSet[_Ring]" = weakref.WeakSet()


@atexit.register
def _stop_consumers() -> None:
    for ring in list(_LIVE_RINGS):
        ring.stop()
        if ring.thread is not None:
            ring.thread.join(timeout=10)


class CopyStage:
    """See Note [The copy stage]. `consumer_thread`: land downloads on a thread of their own
    (default: on a GPU), so the thread queuing them (autograd's) never runs their consumers
    itself; otherwise they are landed when their slot is needed again, or at drain()."""

    def __init__(
        self,
        device: torch.device,
        slot_bytes: int = SLOT_BYTES,
        slots: int = SLOTS,
        lanes=None,
        pin: bool = True,
        consumer_thread: Optional[bool] = None,
    ):
        from .host_buffers import HostArena

        if slots < 2 or slot_bytes < 4096:
            raise ValueError(
                f"CopyStage: need >= 2 slots of >= 4096 bytes; got {slots} x {slot_bytes}"
            )
        self.device = device
        self.lanes = lanes if lanes is not None else lanes_for(device)
        self.slot_bytes = slot_bytes // 64 * 64
        self._arena = HostArena(
            sizing.copy_stage_bytes(slot_bytes, slots), lock=pin, register=True, pooled=True
        )
        self._slots = [self._arena.empty(self.slot_bytes) for _ in range(slots)]
        self._ring = _Ring(slots, self.lanes)
        if consumer_thread is None:
            consumer_thread = self.lanes.kind == "cuda"
        if consumer_thread:
            ring = self._ring
            ring.thread = threading.Thread(target=ring.run, name="zs-copy-consumer", daemon=True)
            ring.thread.start()
            _LIVE_RINGS.add(ring)
            weakref.finalize(self, ring.stop)
        self._ups: Deque[_InFlight] = deque()  # uploads holding a slot, queue order
        self._unfenced = None  # the last upload since fence(): the compute stream waits on it
        self._tail = _Tail()  # the last upload and download since drain(): the host waits
        self._unreleased = None  # the last download since release_sources()
        # Host memory the copies queued read or write, kept alive until they are known
        # complete (Note [Host memory of a copy in flight]).
        self._held: Deque[tuple] = deque()  # (upload event, its host source), queue order
        self._landing: Deque[tuple] = deque()  # (event, direct download's destination)
        weakref.finalize(
            self, _orphan, self.lanes, self._tail, self._held, self._landing, self._slots
        )
        self.stats = {"d2h_bytes": 0, "h2d_bytes": 0, "copies": 0, "host_waits": 0}

    def slot_numel(self, dtype: torch.dtype) -> int:
        """Elements of `dtype` one slot holds (the largest piece staging() hands out)."""
        return self.slot_bytes // torch.empty((), dtype=dtype).element_size()

    # --- slots -----------------------------------------------------------------------------------
    def _take_slot(self) -> int:
        """A free slot. When none is, the oldest upload is retired, or the oldest download
        landed here, or (with the consumer thread) the host waits for it to free one."""
        ring = self._ring
        while True:
            self._raise_if_failed()
            with ring.cv:
                if ring.free:
                    return ring.free.popleft()
                f = self._ups.popleft() if self._ups else None
                if f is None and ring.thread is None and ring.downs:
                    f = ring.downs.popleft()
                    ring.busy -= 1
                if f is None and (ring.thread is None or ring.busy == 0):
                    raise RuntimeError(
                        "copy stage: every slot is staged and not committed; commit() each "
                        "staging() before asking for another"
                    )
                if f is None:
                    self.stats["host_waits"] += 1
                    ring.cv.wait_for(lambda: ring.free or ring.error is not None)
                    continue
            ring.land(f, self.stats)

    def _raise_if_failed(self) -> None:
        if self._ring.error is not None:
            raise RuntimeError(
                "copy stage: a landed download's consumer failed (the gradients of this "
                "backward are incomplete)"
            ) from self._ring.error

    def _view(self, slot: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return self._slots[slot].view(dtype)[:numel]

    # --- downloads -------------------------------------------------------------------------------
    def to_host(self, src: torch.Tensor, consume: Callable[[int, torch.Tensor], None]) -> None:
        """Queues src (1-D, on the device) to the host in slot-sized chunks; consume(offset,
        chunk) runs on the host once each chunk has landed (at the latest at drain())."""
        src = src.reshape(-1)
        step = self.slot_numel(src.dtype)
        ring = self._ring
        for lo in range(0, src.numel(), step):
            piece = src[lo : lo + step]
            slot = self._take_slot()
            host = self._view(slot, piece.numel(), src.dtype)
            event = self.lanes.copy(host, piece, upload=False)
            self._downloaded(event, piece)
            with ring.cv:
                ring.downs.append(_InFlight(slot, event, functools.partial(consume, lo, host)))
                ring.busy += 1
                ring.cv.notify_all()

    def download(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Queues src (on the device) straight into dst (page-locked host memory, same dtype
        and size), no slot and no consumer; dst holds the values from drain() on."""
        if dst.dtype != src.dtype or dst.numel() != src.numel():
            raise ValueError(
                f"CopyStage.download: {src.numel()} elements of {src.dtype} into "
                f"{dst.numel()} of {dst.dtype}; a direct download neither converts nor cuts"
            )
        if src.numel():
            event = self.lanes.copy(dst.reshape(-1), src.reshape(-1), False)
            self._downloaded(event, src)
            self._landing.append((event, dst))

    def _downloaded(self, event, src: torch.Tensor) -> None:
        self._tail.down = self._unreleased = event
        self.stats["d2h_bytes"] += src.numel() * src.element_size()
        self.stats["copies"] += 1

    def download_mark(self):
        """A mark of the downloads queued so far, for host_wait_mark (None: nothing queued
        since the last drain())."""
        return self._tail.down

    def release_landed(self) -> None:
        """Drops the destinations of the direct downloads seen complete, in queue order
        (the stage holds them until then: Note [Host memory of a copy in flight])."""
        while self._landing and self.lanes.ready(self._landing[0][0]):
            self._landing.popleft()

    def release_sources(self) -> None:
        """The compute stream waits (on the device) for every download queued so far: work
        queued after this may overwrite their sources."""
        if self._unreleased is not None:  # one lane: its last event covers the earlier ones
            self.lanes.device_wait(self._unreleased)
            self._unreleased = None

    def drain(self) -> None:
        """Every queued copy has landed (downloads consumed, uploads' sources free again).
        A lane finishes its copies in order, so the host waits once per lane, on its last."""
        ring = self._ring
        if ring.thread is not None:
            with ring.cv:
                if ring.busy:
                    self.stats["host_waits"] += 1
                    ring.cv.wait_for(lambda: ring.busy == 0)
        last_down, self._tail.down = self._tail.down, None
        if last_down is not None and not self.lanes.ready(last_down):
            # Without the thread: covers the slots' copies queued before it, too.
            self.stats["host_waits"] += 1
            self.lanes.host_wait(last_down)
        while ring.downs and ring.thread is None:
            with ring.cv:
                f = ring.downs.popleft()
                ring.busy -= 1
            ring.land(f, self.stats)
        last, self._tail.up = self._tail.up, None
        if last is not None and not self.lanes.ready(last):
            self.stats["host_waits"] += 1
            self.lanes.host_wait(last)
        while self._ups:
            ring.land(self._ups.popleft(), self.stats)
        self._held.clear()  # every copy has completed
        self._landing.clear()
        if _ORPHANS:
            _release_orphans()
        self._raise_if_failed()

    def busy_seconds(self) -> Dict[str, float]:
        """Seconds the lanes spent copying, per direction ("h2d", "d2h"), so far."""
        return self.lanes.busy_seconds()

    # --- uploads ---------------------------------------------------------------------------------
    def staging(self, numel: int, dtype: torch.dtype) -> Staged:
        """A page-locked host buffer of `numel` elements (at most slot_numel(dtype)) to fill
        and then commit()."""
        if numel > self.slot_numel(dtype):
            raise ValueError(
                f"CopyStage.staging: {numel} elements of {dtype} exceed a slot "
                f"({self.slot_numel(dtype)}); cut the piece at slot_numel()"
            )
        slot = self._take_slot()
        return Staged(slot, self._view(slot, numel, dtype))

    def commit(self, staged: Staged, dst: torch.Tensor) -> None:
        """Queues the staged values' copy into dst (on the device)."""
        event = self.lanes.copy(dst.reshape(-1), staged.host, upload=True)
        self._ups.append(_InFlight(staged.slot, event, None))
        self._unfenced = self._tail.up = event
        self.stats["h2d_bytes"] += staged.host.numel() * staged.host.element_size()
        self.stats["copies"] += 1

    def upload(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Queues src (page-locked host memory) into dst (on the device), no staging; src
        must stay unchanged until the host knows the copy completed (drain(), or
        release_held() finding it done). The stage keeps src alive until then, so a caller
        may drop a staging buffer at once: it returns to its arena only when its upload is
        seen complete (Note [Host memory of a copy in flight])."""
        event = self.lanes.copy(dst.reshape(-1), src.reshape(-1), upload=True)
        self._unfenced = self._tail.up = event
        self._held.append((event, src))
        self.stats["h2d_bytes"] += src.numel() * src.element_size()
        self.stats["copies"] += 1

    def release_held(self, wait: bool = False) -> bool:
        """Drops the host sources of the uploads seen complete, in queue order; with `wait`,
        when none is, the host waits for the oldest. Returns whether any were dropped."""
        dropped = False
        while self._held and self.lanes.ready(self._held[0][0]):
            self._held.popleft()
            dropped = True
        if wait and not dropped and self._held:
            self.stats["host_waits"] += 1
            self.lanes.host_wait(self._held[0][0])
            self._held.popleft()  # only now: its source is released once the copy is done
            dropped = True
        return dropped

    def after_uploads(self, launch: Callable[[], object]):
        """`launch()` (a collective that reads what was uploaded) ordered after every upload
        queued so far, without making the compute stream wait for them: on a GPU it is
        issued from the upload lane. Returns what launch returns; its work must be waited
        on later from the compute stream (an async collective's handle)."""
        return self.lanes.after_uploads(launch)

    def bind_thread(self) -> None:
        """Makes the stage's device current on the calling thread."""
        self.lanes.bind_thread()

    def upload_mark(self):
        """A mark of the uploads queued so far, for wait_mark (None: nothing queued)."""
        return self._tail.up

    def wait_mark(self, mark) -> None:
        """The compute stream waits (on the device) for the uploads up to `mark`."""
        if mark is not None:
            self.lanes.device_wait(mark)

    def host_wait_mark(self, mark) -> None:
        """The host waits until the copies of one lane up to `mark` (upload_mark() or
        download_mark()) completed: uploads' host sources may be rewritten after it, and
        downloads' destinations read. Drops the held host memory of those it now knows
        complete."""
        if mark is None:
            return
        if not self.lanes.ready(mark):
            self.stats["host_waits"] += 1
            self.lanes.host_wait(mark)
        self.release_held()
        self.release_landed()

    def fence(self) -> None:
        """The compute stream waits (on the device) for every upload queued so far."""
        if self._unfenced is not None:  # one lane: its last event covers the earlier ones
            self.lanes.device_wait(self._unfenced)
            self._unfenced = None


def to_device(stage: Optional["CopyStage"], src: torch.Tensor, dst: torch.Tensor) -> None:
    """Host memory `src` into `dst`: on `stage`'s upload lane when there is one (src must stay
    unchanged until its fence or drain), else a copy on the current stream."""
    if stage is not None:
        stage.upload(src, dst)
    else:
        dst.copy_(src, non_blocking=True)


class CopyMeter:
    """A copy stage's bytes and busy seconds since the last count(), into a telemetry's
    "d2h" and "h2d" tiers (the PCIe link's achieved GB/s). On a GPU the seconds of copies
    still in flight are counted at a later count()."""

    KEYS = (("d2h", "d2h_bytes"), ("h2d", "h2d_bytes"))

    def __init__(self, stage: CopyStage, telemetry):
        self.stage, self.telemetry = stage, telemetry
        self._seen = self._now()

    def _now(self) -> Dict[str, tuple]:
        busy = self.stage.busy_seconds()
        return {tier: (self.stage.stats[key], busy[tier]) for tier, key in self.KEYS}

    def count(self) -> None:
        now = self._now()
        for tier, (nbytes, seconds) in now.items():
            then = self._seen[tier]
            self.telemetry.moved(tier, nbytes - then[0], seconds - then[1])
        self._seen = now


class DeviceSink(StagedSink):
    """A device partition written from the host through a copy stage, in pieces of at most
    `piece` elements: the staging/commit protocol the optimizer's update already writes a
    stage-3 ShardSink through (zero/sharded.py, offload/optimizer_swap.py)."""

    def __init__(self, part: torch.Tensor, stage: CopyStage):
        self.part = part
        self.stage = stage
        self.numel = part.numel()
        self.dtype = part.dtype
        self.piece = stage.slot_numel(part.dtype)
        self._open: dict = {}

    def staging(self, lo: int, hi: int) -> torch.Tensor:
        staged = self.stage.staging(hi - lo, self.dtype)
        self._open[(lo, hi)] = staged
        return staged.host

    def commit(self, lo: int, hi: int) -> None:
        self.stage.commit(self._open.pop((lo, hi)), self.part[lo:hi])

    def upload_from(self, lo: int, hi: int, host: torch.Tensor) -> bool:
        """Elements [lo, hi) straight from page-locked host memory of the partition's dtype."""
        if host.dtype != self.dtype:
            return False
        self.stage.upload(host, self.part[lo:hi])
        return True
