"""Saved inputs of checkpointed calls parked in page-locked host memory (the
`activation_checkpointing.cpu_checkpointing` option, DeepSpeed's `checkpoint_in_cpu`).

Note [Parked activations]
  A reentrant checkpoint saves only its inputs for backward; cpu_checkpointing keeps them in
  host memory instead of device memory, so a stack of L checkpointed blocks holds about one
  block's input on the device instead of L. DeepSpeed (and torch's save_on_cpu) copy each one
  with a blocking `.to("cpu")` in the forward and a copy back before the recomputation. Here
  both cross on a copy stage's lanes (offload/copy_stage.py), asynchronously:

  - park (forward, the saved-tensor pack hook): the input is downloaded on the d2h lane,
    after the compute stream's work so far, straight into a page-locked buffer of a growing
    pool of pooled host arenas (registered with the GPU once per chunk, not per tensor). The
    lane keeps the device tensor alive until the copy ran (record_stream), so the program may
    drop it at once and the caching allocator reuses the block only after the copy; the
    compute stream never waits.
  - fetch (backward, the unpack hook, before the recomputation): the host waits until that
    download completed (long done by then: a whole forward and part of backward ran since),
    the values go up on the h2d lane into a fresh device tensor, and the compute stream waits
    for that upload only, on the device. The input parked just before it, the next one
    backward needs, is uploaded right behind it (one ahead), so its copy overlaps this
    recomputation. A host buffer lives as long as the saved tensor (autograd frees it after
    its node's backward; a retained graph fetches it again), and returns to its pool once
    the stage also saw its upload complete.

  A saved input changed in place after its call (`h += checkpoint(f, h)`) is refused at
  backward, as autograd refuses it without cpu_checkpointing: the download may have read
  either value. The check is the tensor's version counter, read while the program still
  holds the tensor: at each later park (the next checkpointed call) and at its fetch, so a
  change followed by dropping the tensor before backward is caught too, unless it came after
  the forward's last checkpointed call (the parking holds no reference: holding one would
  keep the device memory it frees).
  On the CPU there is no device memory to spare, so nothing moves (as DeepSpeed's `.to("cpu")`
  is a no-op there); on the simulated device (zerostream.testing.sim_device) the stage takes
  the GPU path, so tests see every copy, wait and buffer of it.
"""

from __future__ import annotations

import weakref
from collections import deque
from typing import Deque, Dict, List, Optional

import torch

from . import lanes
from .copy_stage import CopyStage
from .host_buffers import HostArena

CHUNK_BYTES = 64 << 20  # a pooled chunk (or one request's size, when larger)


class _HostPool:
    """Page-locked host buffers from pooled arenas, one more chunk of CHUNK_BYTES (or of
    the request) when the ones mapped are in use: buffers reused across steps, and at most
    one chunk locked beyond the peak of what is parked at once (doubling chunks had locked
    1.6-1.9 times that peak). One registration per chunk, all in the first step."""

    def __init__(self):
        self.chunks: List[HostArena] = []

    def empty(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        nbytes = numel * dtype.itemsize
        for arena in self.chunks:
            if int(arena.stats()["budget"]) < nbytes:
                continue  # a smaller chunk: it could never hold this one
            t = arena.try_empty(numel, dtype)
            if t is not None:
                return t
        arena = HostArena(max(CHUNK_BYTES, nbytes), lock=True, register=True, pooled=True)
        self.chunks.append(arena)
        return arena.empty(numel, dtype)

    def bytes_mapped(self) -> int:
        return sum(int(a.stats()["budget"]) for a in self.chunks)


class Parked:
    """One saved input in host memory (or, once fetched ahead, on its way back)."""

    __slots__ = ("device", "shape", "dtype", "host", "mark", "source", "version", "back", "up")
    __slots__ += ("changed", "__weakref__")

    def __init__(self, t: torch.Tensor, host: torch.Tensor, mark):
        self.device, self.shape, self.dtype = t.device, t.shape, t.dtype
        self.host, self.mark = host, mark
        self.source = weakref.ref(t)  # for the in-place check only; does not keep t alive
        self.version = t._version
        self.back: Optional[torch.Tensor] = None  # the device copy, once its upload is queued
        self.up = None  # that upload's mark
        self.changed: Optional[int] = None  # the source's version seen changed, if it was

    def check_source(self) -> None:
        """Remembers an in-place change of the source while it is still alive."""
        source = self.source()
        if source is not None and source._version != self.version and self.changed is None:
            self.changed = source._version


class ActivationParking:
    """Parks and fetches saved inputs on one device (Note [Parked activations])."""

    def __init__(self, device: torch.device):
        self.device = device
        self.simulated = lanes.simulated_cuda  # held: what parking_for compares
        # Direct copies only: two minimal slots, and no consumer thread (nothing to land).
        self.stage = CopyStage(device, slot_bytes=4096, slots=2, consumer_thread=False)
        self.pool = _HostPool()
        self._order: Deque[weakref.ref] = deque()  # parked, forward order (not yet fetched)
        self.stats = {"parked": 0, "parked_bytes": 0, "fetched": 0, "fetched_ahead": 0}

    def park(self, t: torch.Tensor) -> Parked:
        self.stage.release_landed()
        self.stage.release_held()
        # The inputs parked before this one: changed in place since, while the program still
        # held them (`h += checkpoint(f, h)`, then the next block)? Recorded now, refused at
        # backward, even if the program drops them in between.
        for r in self._order:
            q = r()
            if q is not None:
                q.check_source()
        src = t.detach()
        if not src.is_contiguous():
            src = src.contiguous()
        host = self.pool.empty(src.numel(), src.dtype)
        self.stage.download(src, host)
        p = Parked(t, host, self.stage.download_mark())
        self._order.append(weakref.ref(p))
        self.stats["parked"] += 1
        self.stats["parked_bytes"] += src.numel() * src.element_size()
        return p

    def _upload(self, p: Parked) -> None:
        self.stage.host_wait_mark(p.mark)  # the host buffer holds the values from here on
        p.back = torch.empty(p.shape, dtype=p.dtype, device=p.device)
        self.stage.upload(p.host, p.back)  # the stage holds the host buffer until it ran
        p.up = self.stage.upload_mark()

    def fetch(self, p: Parked) -> torch.Tensor:
        p.check_source()
        if p.changed is not None:
            raise RuntimeError(
                "activation checkpointing (cpu_checkpointing): an input saved for backward by "
                f"a checkpointed call (shape {tuple(p.shape)}, {p.dtype}) was modified by an "
                f"in-place operation after the call (version {p.version} -> "
                f"{p.changed}); autograd refuses this without cpu_checkpointing too. "
                "Use an out-of-place operation (h = h + checkpoint(f, h))"
            )
        if p.back is None:
            self._upload(p)
        else:
            self.stats["fetched_ahead"] += 1
        ahead = self._next_after(p)
        if ahead is not None:
            self._upload(ahead)  # behind p's upload on the lane: overlaps p's recomputation
        self.stage.wait_mark(p.up)  # the compute stream waits for p's upload only
        back, p.back = p.back, None
        self.stats["fetched"] += 1
        return back

    def _next_after(self, p: Parked) -> Optional[Parked]:
        """The input parked just before p that is not on its way back yet: backward's next.
        Drops p and every input whose graph is gone (never fetched) from the order."""
        live = [q for q in (r() for r in self._order) if q is not None and q is not p]
        before = None
        for r in self._order:
            q = r()
            if q is p:
                break
            if q is not None and q.back is None:
                before = q
        else:
            before = None  # p was not in the order (a retained graph's second backward)
        self._order = deque(weakref.ref(q) for q in live)
        return before

    def drain(self) -> None:
        """Every copy queued so far completed (engine teardown, tests)."""
        self.stage.drain()


_PARKINGS: Dict[str, ActivationParking] = {}


def moves_to_host(device: torch.device) -> bool:
    """Whether a saved tensor on `device` is parked: a CUDA device (or the simulated one);
    on the CPU it already is in host memory."""
    return device.type == "cuda" or lanes.simulated_cuda is not None


def parking_for(device: torch.device) -> ActivationParking:
    """The device's parking; a new one when the simulated device changed since (its stage's
    lanes belong to the device it was made on)."""
    parking = _PARKINGS.get(str(device))
    if parking is None or parking.simulated is not lanes.simulated_cuda:
        parking = _PARKINGS[str(device)] = ActivationParking(device)
    return parking


def forget_parkings() -> None:
    """Drops every device's parking after its copies completed (checkpointing's reset)."""
    for parking in list(_PARKINGS.values()):
        parking.drain()
    _PARKINGS.clear()


def parking_stats() -> dict:
    """Totals over the parkings alive: saved inputs parked and fetched, bytes each way, and
    the page-locked host bytes mapped for them."""
    totals = {"parked": 0, "parked_bytes": 0, "fetched": 0, "fetched_ahead": 0}
    totals.update(d2h_bytes=0, h2d_bytes=0, host_bytes_mapped=0)
    for parking in _PARKINGS.values():
        for k, v in parking.stats.items():
            totals[k] += v
        totals["d2h_bytes"] += parking.stage.stats["d2h_bytes"]
        totals["h2d_bytes"] += parking.stage.stats["h2d_bytes"]
        totals["host_bytes_mapped"] += parking.pool.bytes_mapped()
    return totals
