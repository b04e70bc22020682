"""offload_param "nvme": ZeRO-3 shards live in the swap store, one extent per parameter
(`<nvme_path>/zerostream/rank<R>/params/`), and visit host memory only while they are read
for a gather or written after an update.

Host memory for those visits comes from one page-locked arena of `buffer_count` x
`buffer_size` elements (ds_config offload_param). A shard larger than `buffer_size` does not
fail as in DeepSpeed ("More elements ... than buffer size"): the arena is raised to hold the
largest shard twice, with one log line naming the setting. When every buffer is busy a read
waits for one to come back (the arena's backpressure), it never asserts. When the recorded
stage-3 trace reads ahead more than `buffer_count` buffers hold, buffer_count is raised to fit
(`fit_read_ahead`, one log line naming the setting): otherwise the reads that find no buffer
run synchronously when their module needs them. The first `max_in_cpu` elements of shards
stay in host memory instead of going to disk; with "auto" the most-read shards come back
into host memory after the first step (Note [Parameter shards in host memory] in
offload/placement/): the shards are one of the placer's HostTiers, and know no other tier.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable, Deque, Dict, List, Optional

import torch

from ... import sizing
from ...comm import ranks_on_this_host
from ...offload.copy_stage import to_device
from ...offload.host_buffers import HostArena, arena_bytes
from ...offload.io_engine import IoEngine
from ...offload.memory_preflight import skewed
from ...offload.placement import Placer, place_shards
from ...offload.sinks import StagedSink
from ...offload.swap_store import SwapStore
from ...telemetry import NULL_TELEMETRY
from .param import ShardHome, ZeroParam
from .shard_writes import ShardWrites

logger = logging.getLogger("zerostream")


class ParamSwapper:
    def __init__(self, offload_param, io_config, rank: int, verify_checksums: bool = False):
        if not offload_param.nvme_path:
            raise ValueError(
                'zero_optimization.offload_param.nvme_path: required with "device": "nvme"; '
                "give a directory on a fast local disk"
            )
        self.path = offload_param.nvme_path
        self.buffer_count = max(1, offload_param.buffer_count)
        self.buffer_size = max(1, offload_param.buffer_size)
        # "auto": every shard to disk first; move_in() brings the most-read back.
        self.auto = offload_param.max_in_cpu == "auto"
        self.max_in_cpu = 0 if self.auto else int(offload_param.max_in_cpu)
        self.kept_arena: Optional[HostArena] = None  # the shards "auto" brought back
        self.read_counts: Dict[int, int] = {}  # ds_id -> reads in the trace "auto" used
        # "auto" before it chooses: the stage-3 trace's read counts, and whether a step has
        # run its whole plan since (rehome_when_measured).
        self.pending_reads: Optional[Dict[ZeroParam, int]] = None
        self.plan_has_run = False
        # The placer that places "auto" (join): the stage's, or the partitioner's own until
        # an optimizer adopts these shards.
        self.placer: Optional[Placer] = None
        self.kept_budget = 0
        self.kept_bytes = 0  # the kept arena's size
        self.pin_memory = offload_param.pin_memory
        try:
            self.store = SwapStore(
                IoEngine(io_config),
                self.path,
                rank=rank,
                name="params",
                verify_checksums=verify_checksums,
            )
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"zero_optimization.offload_param.nvme_path: cannot keep parameter shards "
                f"under {self.path!r}: {exc}",
            ) from exc
        self.arena: Optional[HostArena] = None
        self.arena_bytes = 0
        self.swapped_bytes = 0  # every shard on disk, as staging would hold it
        self._swapped: set = set()
        self.in_cpu_numel = 0
        self._in_cpu: set = set()  # ds_ids of the shards counted in in_cpu_numel
        self.bytes_read = self.bytes_written = 0
        self.reads = self.writes = 0
        self.deferred_reads = 0  # prefetched shards that found no free buffer (read late)
        self.wait_seconds = 0.0  # the host waited this long for shard reads (_land)
        # The last step's share of wait_seconds (Note [Which tier first]).
        self._wait_mark = 0.0
        self.last_step_wait = 0.0
        self.auto_buffer_count = True  # fit_read_ahead may raise buffer_count
        self.telemetry = NULL_TELEMETRY  # the engine's, once an optimizer owns the params
        self.pending: Deque["PendingReads"] = collections.deque()  # see start_reads
        # Shard writes, asynchronous (Note [Shard writes beside the forward's reads] in
        # shard_writes.py); the lock keeps the written shards' count beside the update's
        # thread.
        self.shard_writes = ShardWrites(self.store, lambda: self.telemetry)
        self._write_lock = threading.Lock()
        # Called before "auto" moves shards into host memory (an update behind the forward
        # is waited for: it may still be writing them).
        self.before_move: Optional[Callable[[], None]] = None

    def require_space(self, params, world: int, persistence_threshold: int) -> None:
        """Preflight before a model's shards are swapped out: the shards that will go to disk
        (params above the persistence threshold, past the first max_in_cpu elements), with
        the store's rounding, against the free space. A lower bound, so it never refuses a
        run that fits; the store still names the tensor if a later write finds no room."""
        sizes, in_cpu = [], self.in_cpu_numel
        for p in params:
            if p.numel() <= persistence_threshold:
                continue
            shard = -(-p.numel() // max(1, world))
            if in_cpu + shard <= self.max_in_cpu:
                in_cpu += shard
                continue
            sizes.append(shard * p.element_size())
        if sizes:
            self.store.require_space(
                sizes, "zero_optimization.offload_param.nvme_path", sharing=ranks_on_this_host()
            )

    def _host(self, numel: int, dtype: torch.dtype, uploads=None) -> torch.Tensor:
        """A page-locked staging buffer for a read. When the arena is full: buffers whose
        uploads have completed go back first, then reads issued ahead land (oldest first),
        then the host waits for the oldest upload still reading a buffer (`uploads`, the copy
        stage); only then does it wait on the arena."""
        arena = self._ensure_arena(numel, dtype)
        while True:
            if uploads is not None:
                uploads.release_held()
            buf = arena.try_empty(numel, dtype)
            if buf is not None:
                return buf
            if self.pending:
                self.pending[0].land()
            elif uploads is None or not uploads.release_held(wait=True):
                return arena.empty(numel, dtype)

    def _buffer_bytes(self) -> int:
        """One buffer of buffer_size 16-bit elements, as the arena counts it."""
        return sizing.param_buffer_bytes(self.buffer_size)

    def _configured_budget(self) -> int:
        """buffer_count x buffer_size, but never more than every swapped shard at once: the
        staging arena is page-locked whole when made (Note [Pooled host arenas])."""
        return sizing.param_staging_budget(self.buffer_count, self.buffer_size, self.swapped_bytes)

    def fit_read_ahead(self, nbytes: int) -> None:
        """The recorded trace reads up to `nbytes` of shards (whole arena pages each) ahead
        at once: raises buffer_count so they all find staging, not only the first few."""
        if not self.auto_buffer_count or nbytes <= max(self._configured_budget(), self.arena_bytes):
            return
        count = sizing.read_ahead_buffer_count(nbytes, self.buffer_size)
        logger.info(
            "zero_optimization.offload_param.buffer_count: the stage-3 trace reads %d KiB "
            "of shards ahead at once, %d buffers of %d elements hold %d KiB; raised to %d",
            nbytes // 1024,
            self.buffer_count,
            self.buffer_size,
            self._configured_budget() // 1024,
            count,
        )
        self.buffer_count = count  # the next read makes the larger arena (_ensure_arena)

    def _ensure_arena(self, numel: int, dtype: torch.dtype) -> HostArena:
        """Makes the reads' arena hold two shards of `numel`, and buffer_count x buffer_size
        if larger. A larger budget replaces the arena only when no read ahead holds its
        buffers (buffers already handed out keep the old arena's memory until freed); a
        pooled arena is locked and registered whole when made, so it grows at least
        twofold. (Writes have a buffer of their own: Note [Shard writes beside the
        forward's reads].)"""
        need = sizing.param_staging_need(numel * dtype.itemsize)
        configured = self._configured_budget()
        grow = configured > self.arena_bytes and not self.pending
        if self.arena is None or need > self.arena_bytes or grow:
            budget = max(need, configured, self.arena_bytes)
            if self.arena is not None and need > self.arena_bytes:
                budget = max(budget, 2 * self.arena_bytes)
            if need > self.buffer_count * self._buffer_bytes():
                logger.info(
                    "zero_optimization.offload_param.buffer_size: a shard of %d %s elements "
                    "does not fit %d 16-bit elements; staging memory raised to %d KiB",
                    numel,
                    str(dtype).replace("torch.", ""),
                    self.buffer_size,
                    budget // 1024,
                )
            # Staging hands buffers out and back every gather: one registration for all.
            self.arena = HostArena(budget, lock=self.pin_memory, register=True, pooled=True)
            self.arena_bytes = budget
        return self.arena

    def start_reads(
        self, zps: List[ZeroParam], send: torch.Tensor, offsets: List[int], uploads=None
    ) -> "PendingReads":
        """Issues the reads of the swapped shards among `zps` into free staging buffers
        and returns at once (a prefetch); `PendingReads.land()` puts every shard into
        `send` (through `uploads`, a copy stage, when given: see _land). Shards that find
        no free buffer now are read when it lands."""
        self.flush_writes()
        ahead, later = [], []
        start, before = time.perf_counter(), self.bytes_read
        for zp, off in zip(zps, offsets):
            buf = None
            if zp.on_nvme:
                arena = self._ensure_arena(zp.shard_numel, zp.dtype)
                if uploads is not None:
                    uploads.release_held()  # buffers whose uploads completed are free again
                buf = arena.try_empty(zp.shard_numel, zp.dtype)
            if buf is None:
                later.append((zp, off))
                self.deferred_reads += zp.on_nvme
                continue
            ahead.append((zp, off, buf, self.store.read(zp.ds_id, buf)))
            self.reads += 1
            self.bytes_read += buf.numel() * buf.element_size()
        reads = PendingReads(self, send, ahead, later, start, self.bytes_read - before, uploads)
        self.pending.append(reads)
        return reads

    # --- where a shard lives ---------------------------------------------------------------------
    def home(self, zp: ZeroParam, values: torch.Tensor) -> bool:
        """Where a new shard (`values`) lives: host memory while max_in_cpu allows (returns
        False: the caller keeps it), else the swap store (written now; `zp.shard` None)."""
        if zp.ds_id in self._in_cpu:  # homed here before (zero.Init, then the engine)
            return False
        if sizing.kept_in_cpu(zp.shard_numel, self.in_cpu_numel, self.max_in_cpu):
            self.in_cpu_numel += zp.shard_numel
            self._in_cpu.add(zp.ds_id)
            return False
        self._write_extent(zp, values)
        zp.move_shard(ShardHome.NVME)
        return True

    def nvme_bytes(self, zps: List[ZeroParam]) -> int:
        """Bytes of those of `zps` whose shards are on disk."""
        return sum(zp.shard_numel * zp.dtype.itemsize for zp in zps if zp.on_nvme)

    @property
    def auto_decided(self) -> bool:
        """False while max_in_cpu "auto" has yet to choose the shards it keeps."""
        return not self.auto or self.kept_arena is not None

    def join(self, placer: Placer) -> None:
        """`placer` places these shards from now on (a stage optimizer's, replacing the
        partitioner's own): their disk traffic counts in its predictions, and with "auto"
        still to choose they wait in its window."""
        if self.placer is not None:
            self.placer.withdraw(self)
        self.placer = placer
        placer.attach_shards(self, not self.auto_decided)

    # --- "auto": when to choose ------------------------------------------------------------------
    def expect_rehome(self, reads: Dict[ZeroParam, int]) -> None:
        """The stage-3 trace was recorded: how often a step reads each shard. The choice
        waits for a step that runs the trace's whole plan (rehome_when_measured)."""
        if not self.auto_decided:
            self.pending_reads, self.plan_has_run = reads, False

    def plan_ran(self) -> None:
        """A step ran the trace's whole plan: its excess is the one to size "auto" from."""
        self.plan_has_run = self.pending_reads is not None

    def plan_abandoned(self) -> None:
        """The trace's plan was abandoned mid-step (the trace is recorded again, and
        expect_rehome called again): that step's peak is no planned step's."""
        self.pending_reads, self.plan_has_run = None, False

    @property
    def waiting_for_plan(self) -> bool:
        """HostTier: a recorded trace waits for a planned step before "auto" chooses."""
        return self.pending_reads is not None

    def rehome_when_measured(self) -> int:
        """Between two steps: the placer places the shards (move_in brings the most-read
        back) once a step has run the trace's whole plan. Its prefetches, read-ahead and the
        params it keeps gathered for reuse (stage3_max_reuse_distance) make a larger peak
        than a recording step's, and "auto" is sized from the peak it measured; a step whose
        plan was abandoned (a module found reading another's params) does not count: sizing
        from one got the 3.17 B run of benchmarks/capacity.md killed for memory twice.
        Returns how many shards moved."""
        self.last_step_wait = skewed(self.wait_seconds - self._wait_mark, "param_wait")
        self._wait_mark = self.wait_seconds
        if self.pending_reads is None or not self.plan_has_run or self.auto_decided:
            return 0
        before = len(self._in_cpu)
        if self.placer is None:  # no stage has adopted the shards: one rank's own placer
            self.join(Placer())
        assert self.placer is not None  # join sets it
        self.placer.place(self)
        self.pending_reads, self.plan_has_run = None, False
        return len(self._in_cpu) - before

    # --- "auto": the placer's HostTier -----------------------------------------------------------
    def _on_disk_read(self) -> List[ZeroParam]:
        """The shards the recorded trace reads that are on disk (what "auto" could keep)."""
        return [zp for zp in (self.pending_reads or {}) if zp.on_nvme]

    def disk_bytes(self) -> int:
        return sum(arena_bytes(zp.shard_numel * zp.dtype.itemsize) for zp in self._on_disk_read())

    def last_wait_seconds(self) -> float:
        return self.last_step_wait

    def disk_bytes_written(self) -> int:
        return self.bytes_written

    def move_in(self, budget_bytes: int, source: str) -> int:
        """offload_param.max_in_cpu "auto", once the trace says how often the step reads
        each shard: the most-read shards on disk that fit `budget_bytes` (the placer's: this
        rank's share of the usable host memory, less a step's measured excess and the
        reserve) are read into one page-locked arena and live there from now on (Note
        [Parameter shards in host memory]). Returns the arena's bytes."""
        if self.before_move is not None:
            self.before_move()
        self.flush_writes()
        reads = self.pending_reads or {}
        self.read_counts = {zp.ds_id: n for zp, n in reads.items()}  # stats(), tests
        while self.pending:  # reads issued ahead land first: no shard moves under a read
            self.pending[0].land()
        on_disk = self._on_disk_read()
        sizes = [arena_bytes(zp.shard_numel * zp.dtype.itemsize) for zp in on_disk]
        self.kept_budget = budget_bytes
        picked = place_shards([reads[z] for z in on_disk], sizes, budget_bytes)
        chosen = [on_disk[i] for i in picked]
        self.kept_bytes = sum(sizes[i] for i in picked)
        self.kept_arena = HostArena(
            max(1, self.kept_bytes),
            lock=self.pin_memory,
            register=True,
            pooled=True,
        )
        saved = 0
        for zp in chosen:
            buf = self.kept_arena.empty(zp.shard_numel, zp.dtype)
            self.store.read(zp.ds_id, buf).wait()
            self.bytes_read += buf.numel() * buf.element_size()
            zp.move_shard(ShardHome.HOST_ARENA, buf)
            self.in_cpu_numel += zp.shard_numel
            self._in_cpu.add(zp.ds_id)
            saved += (reads[zp] + 1) * zp.shard_numel * zp.dtype.itemsize
        logger.info(
            'zero_optimization.offload_param.max_in_cpu "auto": %d of %d shards on disk '
            "(%.2f GiB, the most read) now live in host memory (budget %.2f GiB from %s); "
            "about %.2f GB less disk traffic per step",
            len(chosen),
            len(on_disk),
            sum(zp.shard_numel * zp.dtype.itemsize for zp in chosen) / 2**30,
            budget_bytes / 2**30,
            source,
            saved / 1e9,
        )
        return self.kept_bytes

    def write(self, zp: ZeroParam, values: torch.Tensor) -> None:
        """Writes `values` (one shard) as `zp`'s shard, wherever that lives."""
        if not zp.on_nvme:
            with torch.no_grad():
                zp.shard_in_memory().copy_(values)
            return
        self._write_extent(zp, values)

    def _write_extent(self, zp: ZeroParam, values: torch.Tensor) -> None:
        """One shard to disk, asynchronously (Note [Shard writes beside the forward's
        reads] in shard_writes.py)."""
        with self._write_lock:
            if zp.ds_id not in self._swapped:
                self._swapped.add(zp.ds_id)
                self.swapped_bytes += arena_bytes(zp.shard_numel * zp.dtype.itemsize)
            self.bytes_written += values.numel() * values.element_size()
            self.writes += 1
        self.shard_writes.write(zp.ds_id, values)

    def flush_writes(self) -> None:
        """Waits for every shard write in flight now (before any read of the store)."""
        self.shard_writes.flush()

    def read_into(
        self, zps: List[ZeroParam], send: torch.Tensor, offsets: List[int], uploads=None
    ) -> None:
        """Copies each shard into `send[offset:offset+shard_numel]`: host ones directly,
        swapped ones read into staging buffers as many at a time as the arena holds; with
        `uploads` (a copy stage, `send` on the device) through its upload lane."""
        self.flush_writes()
        pending = []
        start, before = time.perf_counter(), self.bytes_read
        for zp, off in zip(zps, offsets):
            if not zp.on_nvme:
                to_device(uploads, zp.shard_in_memory(), send[off : off + zp.shard_numel])
                continue
            buf = self._host(zp.shard_numel, zp.dtype, uploads)
            pending.append((zp, off, buf, self.store.read(zp.ds_id, buf)))
            self.reads += 1
            self.bytes_read += buf.numel() * buf.element_size()
            if len(pending) >= self.buffer_count:
                self._land(pending, send, uploads)
        self._land(pending, send, uploads)
        if self.bytes_read > before:
            self.telemetry.moved(
                "param_nvme_read", self.bytes_read - before, time.perf_counter() - start
            )

    def _land(self, pending: list, send: torch.Tensor, uploads=None) -> None:
        """Each read's shard from its staging buffer into `send`. Buffers uploaded to the
        device stay with the copy stage until their uploads complete, then go back to the
        arena and the next disk reads (Note [Host memory of a copy in flight]); the host
        does not wait for them here. The time spent waiting for the reads is counted
        (`wait_seconds`: what the disk cost the step beyond what its prefetch hid)."""
        for zp, off, buf, ticket in pending:
            start = time.perf_counter()
            ticket.wait()
            self.wait_seconds += time.perf_counter() - start
            to_device(uploads, buf, send[off : off + zp.shard_numel])
        pending.clear()

    def read(self, zp: ZeroParam) -> torch.Tensor:
        """One shard as a host tensor (a copy of it for host-resident shards)."""
        if not zp.on_nvme:
            return zp.shard_in_memory().clone()
        out = torch.empty(zp.shard_numel, dtype=zp.dtype)
        self.read_into([zp], out, [0])
        return out

    def stats(self) -> dict:
        self.flush_writes()  # the counts and files are the written ones
        return {
            "directory": self.store.directory,
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "reads": self.reads,
            "deferred_reads": self.deferred_reads,
            "wait_seconds": self.wait_seconds,
            "buffer_count": self.buffer_count,
            "writes": self.writes,
            "in_cpu_numel": self.in_cpu_numel,
            "kept_ids": sorted(self._in_cpu),
            "auto_budget_bytes": self.kept_budget,
            "kept_bytes": self.kept_bytes,
            "read_counts": dict(self.read_counts),
            "staging_bytes": self.arena_bytes,
            # Staging buffers the pooled arena's free space was too fragmented to hold.
            "staging_pool_misses": self.arena.stats()["pool_misses"] if self.arena else 0,
        }

    def close(self) -> None:
        """Deletes the shards' swap files (the run is over)."""
        try:
            self.flush_writes()  # their buffers are read until the writes end
        finally:
            self.store.close()
        if self.placer is not None:  # no placement follows: the windows stop
            self.placer.withdraw(self)

    def extent_of(self, zp: ZeroParam):
        """(file, offset, bytes) of zp's shard, its bytes on disk by now."""
        self.flush_writes()
        return self.store.extent_of(zp.ds_id)


class PendingReads:
    """Shard reads issued ahead of a gather (ParamSwapper.start_reads)."""

    def __init__(self, swapper: ParamSwapper, send, ahead, later, start, nbytes, uploads=None):
        self.swapper, self.send, self.ahead, self.later = swapper, send, ahead, later
        self.start, self.nbytes, self.uploads = start, nbytes, uploads
        self.done = False

    def land(self) -> None:
        """Waits for the reads issued ahead, copies them into the send buffer (freeing
        their staging) and reads the rest now."""
        if self.done:
            return
        self.done = True
        self.swapper.pending.remove(self)
        self.swapper._land(self.ahead, self.send, self.uploads)
        if self.nbytes:
            self.swapper.telemetry.moved(
                "param_nvme_read", self.nbytes, time.perf_counter() - self.start
            )
        if self.later:
            zps, offsets = zip(*self.later)
            self.later = []
            self.swapper.read_into(list(zps), self.send, list(offsets), self.uploads)


class ShardSink(StagedSink):
    """One param group's flat 16-bit partition when its shards live in the swap store: the
    optimizer writes updated values through `staging(lo, hi)` + `commit(lo, hi)` (a piece
    at a time, sub-group by sub-group) instead of into one host tensor."""

    def __init__(self, zps: List[ZeroParam], swapper: ParamSwapper):
        self.zps, self.swapper = zps, swapper
        self.starts, off = [], 0
        for zp in zps:
            self.starts.append(off)
            off += zp.shard_numel
        self.numel = off
        self.dtype = zps[0].dtype
        self._stage: Optional[torch.Tensor] = None
        self._partial: Dict[int, torch.Tensor] = {}
        self._filled: Dict[int, int] = {}

    def nvme_bytes(self) -> int:
        """Bytes of this partition's shards that are on disk."""
        return self.swapper.nvme_bytes(self.zps)

    def materialize(self) -> torch.Tensor:
        """The whole partition read into a host tensor (setup and checkpoint loading)."""
        out = torch.empty(self.numel, dtype=self.dtype)
        self.swapper.read_into(self.zps, out, self.starts)
        return out

    def read_range(self, lo: int, hi: int) -> torch.Tensor:
        """Elements [lo, hi) of the partition, reading only the shards they touch."""
        out = torch.empty(hi - lo, dtype=self.dtype)
        for zp, start in zip(self.zps, self.starts):
            a, b = max(lo, start), min(hi, start + zp.shard_numel)
            if a < b:
                out[a - lo : b - lo].copy_(self.swapper.read(zp)[a - start : b - start])
        return out

    def staging(self, lo: int, hi: int) -> torch.Tensor:
        self._stage = torch.empty(hi - lo, dtype=self.dtype)
        return self._stage

    def commit(self, lo: int, hi: int) -> None:
        """Writes every shard completed by the staged piece [lo, hi)."""
        stage, self._stage = self._stage, None
        if stage is None:
            raise RuntimeError("ShardSink.commit: no piece was staged (staging() comes first)")
        for zp, start in zip(self.zps, self.starts):
            end = start + zp.shard_numel
            a, b = max(lo, start), min(hi, end)
            if a >= b:
                continue
            if a == start and b == end:
                self.swapper.write(zp, stage[a - lo : b - lo])
                continue
            part = self._partial.setdefault(zp.ds_id, torch.empty(zp.shard_numel, dtype=self.dtype))
            part[a - start : b - start].copy_(stage[a - lo : b - lo])
            self._filled[zp.ds_id] = self._filled.get(zp.ds_id, 0) + (b - a)
            if self._filled[zp.ds_id] == zp.shard_numel:
                self.swapper.write(zp, part)
                del self._partial[zp.ds_id], self._filled[zp.ds_id]

    def copy_(self, values: torch.Tensor) -> "ShardSink":
        self.staging(0, self.numel).copy_(values)
        self.commit(0, self.numel)
        return self
