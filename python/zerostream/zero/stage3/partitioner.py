"""Partitions parameters into ZeRO-3 shards and moves them between shard and full tensor:
coalesced all-gathers (one collective for many parameters, optionally asynchronous) and
releases. The one place that knows where shards live (the device, or host memory with
offload_param "cpu") and that counts gathered elements (the live-parameter accounting the
prefetch cap and the memory tests read)."""

from __future__ import annotations

import itertools
import time
from typing import Callable, Dict, Iterable, List, Optional

import torch

from ... import comm
from ...offload.copy_stage import CopyStage, to_device
from ...offload.placement import Placer
from ...sizing import is_persistent
from .param import ShardHome, ShardState, ZeroParam, zero_param_of

_IDS = itertools.count()  # ds_id: unique in the process, like DeepSpeed's
LOOSE_CHUNK_BYTES = 256 << 20  # home_loose_shards moves host shards this many bytes at a time


class InflightGather:
    """One coalesced all-gather: the shards of `zps` concatenated (rank-major output of
    world*S elements), copied into each parameter's full buffer when waited on. A prefetch
    of shards on NVMe is in flight as disk reads (`reads`) until launch(): the reads land,
    the shards go up on the upload lane and the all-gather is issued after them, without
    waiting for it. Every rank launches at the same point (the coordinator launches a read
    ahead issued two or more module events before the one that needs it at the event just
    before that one; else wait() does), so the collectives are issued in one order
    everywhere."""

    def __init__(
        self,
        partitioner: "Partitioner",
        zps: List[ZeroParam],
        out,
        handle,
        reads=None,
        mark=None,
        direct: bool = False,
        keep=None,
    ):
        self.partitioner, self.zps, self.out, self.handle = partitioner, zps, out, handle
        # The ds_ids this gather brings in; the others rode along (gather_exact: gathered
        # here already) and are not carved out (None: all of them).
        self.keep = keep
        self.reads = reads
        self.mark = mark  # the uploads into the send buffer (host shards), see Partitioner
        # The shards were copied straight into the full tensors (Note [One rank gathers
        # into the full tensors]): nothing to carve out of a gathered buffer.
        self.direct = direct
        self.done = False

    def launch(self, early: bool = True) -> None:
        """A read ahead's shards into the send buffer and its all-gather issued (async)."""
        if self.reads is None:
            return
        part = self.partitioner
        self.reads.land()
        self.mark = part.uploads.upload_mark() if part.uploads is not None else None
        self.out, self.handle = part.collect(self.reads.send, async_op=True)
        self.reads = None
        part.reading.remove(self)
        part.read_launches["early" if early else "at_wait"] += 1

    def wait(self) -> None:
        if self.done:
            return
        part = self.partitioner
        self.launch(early=False)
        if self.handle is not None:
            start = time.perf_counter()
            self.handle.wait()
            if part.telemetry is not None:
                part.telemetry.moved("all_gather", 0, time.perf_counter() - start)
        if part.uploads is not None:
            part.uploads.wait_mark(self.mark)  # one rank: `out` is the uploaded send buffer
        if not self.direct:
            self._carve()
        for zp in self._kept():
            zp.to_gathered()
            self.partitioner.inflight.pop(zp.ds_id, None)
        self.done = True

    def _kept(self) -> List[ZeroParam]:
        return self.zps if self.keep is None else [zp for zp in self.zps if zp.ds_id in self.keep]

    def _carve(self) -> None:
        """Each parameter's full tensor from the rank-major gathered buffer."""
        rows = self.out.view(self.partitioner.world, -1)
        off = 0
        with torch.no_grad():
            for zp in self.zps:
                k, n = zp.shard_numel, zp.numel
                if self.keep is not None and zp.ds_id not in self.keep:
                    off += k
                    continue
                full = zp.full_flat()
                whole = n // k if k else 0
                if whole:
                    full[: whole * k].view(whole, k).copy_(rows[:whole, off : off + k])
                if n - whole * k:
                    full[whole * k :].copy_(rows[whole, off : off + n - whole * k])
                off += k


class Partitioner:
    """ZeRO-3 parameter partitioning over one data-parallel group."""

    def __init__(
        self,
        group,
        device: torch.device,
        dtype: Optional[torch.dtype],
        offload_param=None,
        persistence_threshold: int = 0,
        model_persistence_threshold: int = 2**63 - 1,
        world: Optional[int] = None,
        rank: Optional[int] = None,
        swapper=None,
        sanity_checks: bool = False,
    ):
        self.group = group
        # zero_optimization.enable_sanity_checks: GatheredParameters without a modifier
        # refuses, on every rank, an in-place change of the params it gathered (gathered.py).
        self.sanity_checks = sanity_checks
        self.world = comm.get_world_size(group) if world is None else world
        self.rank = comm.get_rank(group) if rank is None else rank
        self.device = device
        self.dtype = dtype
        self.offload_device = offload_param.device if offload_param is not None else "none"
        if (self.offload_device == "nvme") != (swapper is not None):
            raise RuntimeError("ZeRO-3: a param swapper comes with offload_param nvme only")
        self.swapper = swapper  # zero/stage3/param_swap.ParamSwapper with offload_param nvme
        if swapper is not None and swapper.placer is None:
            # Its "auto" placement agrees with the other ranks' (Note [Every rank places
            # the same tiers] in offload/placement/) until a stage optimizer adopts it.
            agree = comm.agreement(group, device) if self.world > 1 else None
            swapper.join(Placer(agree=agree))
        self.pin_memory = bool(offload_param.pin_memory) if offload_param is not None else False
        self.persistence_threshold = persistence_threshold
        self.model_persistence_threshold = model_persistence_threshold
        self.persisted_numel = 0
        self.params: Dict[int, ZeroParam] = {}
        self.inflight: Dict[int, InflightGather] = {}
        self.reading: List[InflightGather] = []  # NVMe reads ahead not launched yet, in order
        self.read_launches = {"early": 0, "at_wait": 0}
        self.live_numel = 0  # gathered or in-flight elements of non-persistent params
        self.peak_live_numel = 0
        self.gathers = 0
        self.gathered_numel = 0
        self.telemetry = None  # the engine's StepTelemetry: all-gather bytes and time
        self.shard_listeners: List = []  # called with a ZeroParam whose shard was rewritten
        # Called with the params whose shards a gather is about to read or a write to replace:
        # an optimizer update running behind the forward waits for their pieces there
        # (Note [The step overlapped with the next forward] in zero/overlap.py).
        self.before_shard_access: Optional[Callable[[List[ZeroParam]], None]] = None
        self.host_arenas: List = []  # offload_param cpu: the page-locked shard partitions
        self.host_partitions: List[torch.Tensor] = []  # their memory, one tensor each
        self._loose_scanned = False  # home_loose_shards has run since a shard was made
        # Shards in host memory (offload_param cpu or nvme) cross to the device on the copy
        # stage's upload lane (offload/copy_stage.py; its CPU twin here), and the all-gather
        # is issued after them from that lane: a prefetch's copies overlap the running
        # module's compute instead of queuing in front of it on the compute stream.
        self.uploads = None
        if self.offload_device != "none":
            self.uploads = CopyStage(
                device, slot_bytes=4096, slots=2, pin=self.pin_memory, consumer_thread=False
            )

    # --- partitioning ----------------------------------------------------------------------------
    def shard_device(self) -> torch.device:
        return torch.device("cpu") if self.offload_device != "none" else self.device

    def settle_uploads(self) -> None:
        """Every upload queued from host shards has read them (the host waits): before the
        host rewrites a shard (an optimizer update, a modified or loaded weight)."""
        if self.uploads is not None:
            self.uploads.drain()

    def write_shard(self, zp: ZeroParam, full: torch.Tensor) -> None:
        """Makes this rank's slice of `full` (the whole param) its shard, wherever it lives."""
        if self.before_shard_access is not None:
            self.before_shard_access([zp])
        self.settle_uploads()
        values = zp.shard_values(full)
        with torch.no_grad():
            if self.swapper is not None:
                self.swapper.write(zp, values)
            else:
                zp.shard.copy_(values)
        self.shard_modified(zp)

    def partition(self, params: Iterable[torch.nn.Parameter], broadcast: bool = True) -> None:
        """Makes each not yet partitioned param a ZeRO-3 param: moves it to the run's device
        and dtype, takes rank 0's values (as DeepSpeed does) and keeps only this rank's
        shard. Small params are persistent (stage3_param_persistence_threshold): they stay
        gathered on every rank for the whole run."""
        for p in params:
            if zero_param_of(p) is not None:
                continue
            data = p.data
            if data.is_floating_point() and self.dtype is not None:
                data = data.to(self.dtype)
            data = data.to(self.device)
            if broadcast and self.world > 1:
                comm.broadcast(data, comm.get_global_rank(self.group, 0), group=self.group)
            p.data = data
            zp = ZeroParam(p, next(_IDS), self.world, self.rank, self.device, self.group)
            zp.partitioner = self
            self.params[zp.ds_id] = zp
            values = zp.shard_values(data)  # a view of `data` unless padding is needed
            persist = is_persistent(
                zp.numel,
                self.persistence_threshold,
                self.model_persistence_threshold,
                self.persisted_numel,
            )
            if persist or self.swapper is None or not self.swapper.home(zp, values):
                self._loose_scanned = False
                shard = self._empty_shard(zp.shard_numel, data.dtype)
                with torch.no_grad():
                    shard.copy_(values)
                zp.move_shard(self.new_shard_home(), shard)
            if persist:
                zp.persist = True
                self.persisted_numel += zp.numel
                zp.to_inflight().copy_(data.reshape(-1))
                zp.to_gathered()
            del data, values

    def new_shard_home(self) -> ShardHome:
        """Where a shard kept in memory starts (Note [Shard homes])."""
        return ShardHome.HOST if self.offload_device != "none" else ShardHome.DEVICE

    def _empty_shard(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A shard's first home. Host shards are pageable until a page-locked partition
        takes them (adopt, home_loose_shards): torch's pinned allocator rounds each block up
        to a power of two and keeps the blocks it frees, so pinning them here held up to
        twice the shards' bytes for the whole run once they had moved."""
        return torch.empty(numel, dtype=dtype, device=self.shard_device())

    def empty_partition(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """Memory for one param group's flat shards: on the device, or with offload_param
        "cpu" in a host arena of its own, with offload_param.pin_memory page-locked and
        registered with the GPU, so the copy of each shard to the device before its
        all-gather is an asynchronous DMA, not a synchronous copy out of pageable memory."""
        if self.shard_device().type != "cpu" or self.offload_device == "none":
            return torch.empty(numel, dtype=dtype, device=self.shard_device())
        from ...offload.host_buffers import HostArena, arena_bytes

        nbytes = arena_bytes(numel * dtype.itemsize)
        arena = HostArena(nbytes, lock=self.pin_memory, register=True)
        self.host_arenas.append(arena)
        flat = arena.empty(numel, dtype)
        self.host_partitions.append(flat)
        return flat

    def adopt(self, zps: List[ZeroParam], flat: torch.Tensor) -> None:
        """Moves the shards of `zps` into consecutive slices of `flat` (a param group's flat
        16-bit partition, what the optimizer writes after each update)."""
        off = 0
        in_arena = flat.device.type == "cpu" and self.offload_device != "none"
        home = ShardHome.HOST_ARENA if in_arena else ShardHome.DEVICE
        with torch.no_grad():
            for zp in zps:
                view = flat[off : off + zp.shard_numel]
                view.copy_(zp.shard)
                zp.move_shard(home, view)
                off += zp.shard_numel

    def home_loose_shards(self) -> int:
        """Moves the host shards no param group adopted (frozen params', every one in a run
        without an optimizer, an NVMe run's max_in_cpu ones) into page-locked partitions of
        their own, so their uploads before each gather are DMA too. LOOSE_CHUNK_BYTES at a
        time, each chunk's pageable shards freed as it fills: the peak is one chunk above
        the shards. Runs before the first gather that follows new shards (the optimizer's
        groups have adopted theirs by then). Returns how many shards moved."""
        self._loose_scanned = True
        by_dtype: Dict[torch.dtype, List[ZeroParam]] = {}
        for zp in self._loose():
            by_dtype.setdefault(zp.dtype, []).append(zp)
        for dtype, zps in by_dtype.items():
            chunk: List[ZeroParam] = []
            numel = 0
            for zp in zps:
                if chunk and (numel + zp.shard_numel) * dtype.itemsize > LOOSE_CHUNK_BYTES:
                    self.adopt(chunk, self.empty_partition(numel, dtype))
                    chunk, numel = [], 0
                chunk.append(zp)
                numel += zp.shard_numel
            self.adopt(chunk, self.empty_partition(numel, dtype))
        return sum(len(zps) for zps in by_dtype.values())

    def _loose(self) -> List[ZeroParam]:
        """Host shards in pageable memory: no page-locked partition has taken them yet."""
        return [zp for zp in self.params.values() if zp.home is ShardHome.HOST]

    # --- gather and release ----------------------------------------------------------------------
    def gather(self, zps: Iterable[ZeroParam], async_op: bool = False) -> Optional[InflightGather]:
        """All-gathers the SHARDED params among `zps` in one collective per dtype; waits for
        in-flight ones. With async_op the gather is left in flight (waited on by `wait`)."""
        todo: Dict[torch.dtype, List[ZeroParam]] = {}
        pending = []
        for zp in zps:
            if zp.state is ShardState.SHARDED:
                todo.setdefault(zp.dtype, []).append(zp)
            elif zp.state is ShardState.INFLIGHT and not async_op:
                pending.append(self.inflight[zp.ds_id])
        for p in pending:
            p.wait()
        last = None
        for dtype, group in todo.items():
            last = self._gather(group, dtype, async_op)
        return last

    def gather_exact(
        self, zps: Iterable[ZeroParam], async_op: bool = False
    ) -> Optional[InflightGather]:
        """All-gathers exactly the non-persistent params among `zps`, whatever this rank
        holds of them (Note [One gather sequence on every rank] in coordinator.py): one
        collective per dtype, in a fixed order of dtypes, over the same params on every rank
        that passes the same list. Params this rank has gathered already ride along and are
        not carved out; ones in flight are waited for first. With one rank, only what is
        missing is gathered (nothing to agree on)."""
        zps = [zp for zp in zps if not zp.persist]
        if self.world == 1:
            return self.gather(zps, async_op)
        by_dtype: Dict[torch.dtype, List[ZeroParam]] = {}
        for zp in zps:
            if zp.state is ShardState.INFLIGHT:
                self.inflight[zp.ds_id].wait()
            by_dtype.setdefault(zp.dtype, []).append(zp)
        last = None
        for dtype in sorted(by_dtype, key=str):
            group = by_dtype[dtype]
            fresh = {zp.ds_id for zp in group if zp.state is ShardState.SHARDED}
            last = self._gather(group, dtype, async_op, keep=fresh)
        return last

    def _gather(
        self, zps: List[ZeroParam], dtype: torch.dtype, async_op: bool, keep=None
    ) -> InflightGather:
        """`keep`: the ds_ids among `zps` to bring in (None: all, each SHARDED); the others
        are in the collective only."""
        if self.before_shard_access is not None:
            self.before_shard_access(zps)
        if self.uploads is not None and not self._loose_scanned:
            self.home_loose_shards()
        fresh = zps if keep is None else [zp for zp in zps if zp.ds_id in keep]
        for zp in fresh:
            zp.to_inflight()
            if not zp.persist:
                self.live_numel += zp.numel
        self.peak_live_numel = max(self.peak_live_numel, self.live_numel)
        self.gathers += 1
        self.gathered_numel += sum(zp.numel for zp in zps)
        if self.world == 1 and not any(zp.on_nvme for zp in zps):
            gather = self._gather_alone(zps)
        else:
            gather = self._gather_collective(zps, dtype, async_op)
        gather.keep = keep
        for zp in fresh:
            self.inflight[zp.ds_id] = gather
        if not async_op:
            gather.wait()
        return gather

    def _gather_collective(
        self, zps: List[ZeroParam], dtype: torch.dtype, async_op: bool
    ) -> InflightGather:
        """The shards into one send buffer (read from disk, or uploaded) and its all-gather."""
        send = torch.empty(sum(zp.shard_numel for zp in zps), dtype=dtype, device=self.device)
        offsets, off = [], 0
        for zp in zps:
            offsets.append(off)
            off += zp.shard_numel
        if async_op and any(zp.on_nvme for zp in zps):
            # A prefetch from disk: the reads run while the module before it computes.
            reads = self.swapper.start_reads(zps, send, offsets, self.uploads)
            gather = InflightGather(self, zps, None, None, reads=reads)
            self.reading.append(gather)
            return gather
        if self.swapper is not None:
            self.swapper.read_into(zps, send, offsets, self.uploads)
        else:
            for zp, off in zip(zps, offsets):
                to_device(self.uploads, zp.shard, send[off : off + zp.shard_numel])
        mark = self.uploads.upload_mark() if self.uploads is not None else None
        return InflightGather(self, zps, *self.collect(send, async_op), mark=mark)

    def _gather_alone(self, zps: List[ZeroParam]) -> InflightGather:
        """Note [One rank gathers into the full tensors]: one rank's shard is the whole
        parameter (ceil(n / 1) = n, no padding), so each shard is copied (uploaded from host
        memory on the copy stage's lane) straight into its parameter's full tensor: no send
        buffer allocated, filled and carved again, twice a step for every parameter. A shard
        on disk still goes through the reads' buffer."""
        for zp in zps:
            to_device(self.uploads, zp.shard, zp.full_flat())
        mark = self.uploads.upload_mark() if self.uploads is not None else None
        return InflightGather(self, zps, None, None, mark=mark, direct=True)

    def launch_reads(self, ds_ids, early: bool = True) -> None:
        """Launches the reads ahead that hold any of `ds_ids` (the next module's params, or
        with `early` False the params of the module about to run): their uploads and
        all-gather overlap the module running now."""
        for gather in list(self.reading):
            if any(zp.ds_id in ds_ids for zp in gather.zps):
                gather.launch(early)

    def collect(self, send: torch.Tensor, async_op: bool):
        """(out, handle): every rank's `send` side by side (rank-major). With host shards the
        all-gather is issued after their uploads, from the upload lane, and a synchronous
        one is waited on here, from the compute stream."""
        if self.world == 1:
            return send, None
        out = torch.empty(self.world * send.numel(), dtype=send.dtype, device=self.device)
        start = time.perf_counter()
        if self.uploads is None:
            handle = comm.all_gather_into_tensor(out, send, group=self.group, async_op=async_op)
        else:
            handle = self.uploads.after_uploads(
                lambda: comm.all_gather_into_tensor(out, send, group=self.group, async_op=True)
            )
            if not async_op and handle is not None:
                handle.wait()
                handle = None
        if self.telemetry is not None:  # an async one's wait is counted by InflightGather
            self.telemetry.moved(
                "all_gather", out.numel() * out.element_size(), time.perf_counter() - start
            )
        return out, handle

    def release(self, zp: ZeroParam, in_place: bool = True) -> bool:
        """Frees a gathered param's full tensor unless it is persistent or in use
        (`in_place`: ZeroParam.to_sharded's)."""
        if zp.persist or zp.users > 0 or zp.state is not ShardState.GATHERED:
            return False
        zp.to_sharded(in_place)
        self.live_numel -= zp.numel
        return True

    def release_all(self, persistent: bool = False) -> None:
        """Frees every gathered param not in use; `persistent`: the persistent ones too
        (DeepSpeed's empty_partition_cache, which leaves every param empty; a module's next
        fetch gathers its persistent params again)."""
        for zp in list(self.inflight.values()):
            zp.wait()
        for zp in self.params.values():
            if persistent and zp.persist and zp.users == 0 and zp.state is ShardState.GATHERED:
                zp.to_sharded(in_place=False, persistent_too=True)
            else:
                self.release(zp)

    def refresh_gathered(self, only: Optional[Iterable[int]] = None) -> None:
        """Re-gathers every param still gathered (the persistent ones, and any a running
        module holds) from its updated shard, so no full copy is stale after a step.
        `only`: the ds_ids whose shards changed (an update leaves frozen params as they
        were); every param if None (a load)."""
        by_dtype: Dict[torch.dtype, List[ZeroParam]] = {}
        params = self.params.values() if only is None else [self.params[i] for i in only]
        for zp in params:
            if zp.state is ShardState.INFLIGHT:
                self.inflight[zp.ds_id].wait()
            if zp.state is ShardState.GATHERED:
                zp.state = ShardState.SHARDED  # the full buffer is rewritten in place
                if not zp.persist:
                    self.live_numel -= zp.numel
                by_dtype.setdefault(zp.dtype, []).append(zp)
        for dtype, zps in by_dtype.items():
            self._gather(zps, dtype, async_op=False)

    def shard_modified(self, zp: ZeroParam) -> None:
        for listener in self.shard_listeners:
            listener(zp)

    def summary(self) -> dict:
        shard_bytes = sum(
            zp.shard_numel * zp.shard.element_size()
            for zp in self.params.values()
            if not zp.on_nvme
        )
        return {
            "params": len(self.params),
            "persistent": sum(1 for zp in self.params.values() if zp.persist),
            "persisted_numel": self.persisted_numel,
            "gathered_now": sum(
                1 for zp in self.params.values() if zp.state is ShardState.GATHERED
            ),
            "live_numel": self.live_numel,
            "peak_live_numel": self.peak_live_numel,
            "gathers": self.gathers,
            "gathered_numel": self.gathered_numel,
            "shard_bytes": shard_bytes,
            "shard_device": str(self.shard_device()),
            "shard_arena_bytes": sum(int(a.stats()["in_use"]) for a in self.host_arenas),
            "loose_shards": len(self._loose()),  # none after a gather with host shards
            "read_launches": dict(self.read_launches),
            "offload_param": self.offload_device,
            **({"swap": self.swapper.stats()} if self.swapper is not None else {}),
        }
