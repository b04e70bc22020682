"""Gradient reduction for the partitioned stages: sums every rank's gradients and leaves each
rank, in its fp32 gradient partitions (`targets`), the sum over ranks of the elements it owns.
Averaging, unscaling and clipping are the optimizer's (they need the global norm first).

Stage 1 (Stage1Reducer) accumulates whole local gradients in a flat buffer per group and
reduce-scatters it once per optimizer step. Stage 2 (Stage2Reducer) reduces in buckets of
`reduce_bucket_size` elements as autograd produces them, so no rank holds a full gradient;
stage 3 reuses it with its own layout.

Note [Stage-2 bucket reduction]
  A bucket holds whole parameters in the order autograd finished them; with DeepSpeed's
  layout (each rank owns one contiguous range of the flat group) a bucket's elements belong
  to one, a few or all ranks. For each bucket the reducer lays the pieces out per owner,
  padded to the largest owner's count c, and picks the collective that moves fewer bytes per
  rank: a reduce-scatter of world*c elements moves c*(world-1), an all-reduce of the
  bucket's n elements 2*n*(world-1)/world. So a bucket spread evenly over the ranks (the
  last bucket of a model smaller than reduce_bucket_size, or large buckets) is
  reduce-scattered, half the bytes of an all-reduce; a bucket owned by one rank is
  all-reduced, as DeepSpeed's use_multi_rank_bucket_allreduce does.

Note [Gradients to an offloaded partition]
  With offload_optimizer the gradient partitions are in host memory (the host arena,
  page-locked), and a reduced bucket (its reduce-scatter output, or the span of an
  all-reduced bucket holding this rank's pieces) crosses on the copy stage's download lane
  (offload/copy_stage.py) in the gradients' own 16-bit dtype while backward goes on. What
  happens on the host depends on the partitions' dtype (Landing):

  - 16-bit partitions (gradient_accumulation_steps 1 with a CPU optimizer, whose kernel
    reads 16-bit gradients): the first backward after zero() downloads each piece straight
    into its place in the partition. No slot, no host pass, no fp32 conversion on either
    side, and half the host memory; the values are the reduced 16-bit sums themselves, so
    nothing is lost. Elements no piece wrote (a parameter without a gradient this
    backward, alignment padding) are zeroed at finish(), so zero() needs no memset. A second
    backward before the step (calling backward twice with accumulation steps 1) is added
    into the 16-bit partition, rounded once per extra backward, as torch accumulates a
    16-bit param.grad.
  - fp32 partitions (accumulation over micro-steps): each bucket lands in a staging slot
    and is added into the partition on the host, so accumulation stays fp32 and exact.

  after_backward (stage 2, stage 3) and at_boundary (stage 1) drain the stage and finish()
  the landing: the step never reads a partition with a bucket still in flight. Before, each
  bucket was a synchronous device-to-host copy through pageable memory (the stall of issue
  11). Averaging over ranks is folded into the step's unscale/clip factor (zero/sharded.py),
  not a pass over the partitions.
"""

from __future__ import annotations

import bisect
import functools
import time
from collections import Counter
from dataclasses import dataclass
from typing import Dict, List, Tuple

import torch

from .. import comm
from ..accelerator import same_device
from ..precision import DTYPES
from .bucket_order import BucketOrder
from .flat import FlatGroup, ParamSlot


@dataclass(frozen=True)
class Piece:
    """Elements [lo, hi) of a bucket's flattened gradients, owned by one rank, landing at
    `part_lo` of that rank's partition of group `group`."""

    lo: int
    hi: int
    group: int
    part_lo: int


def widest_owner(pieces: List[List[Piece]]) -> int:
    """Elements of the bucket held by the rank that owns the most of it."""
    return max(sum(p.hi - p.lo for p in ps) for ps in pieces)


def choose_collective(widest: int, numel: int, world: int) -> str:
    """ "reduce_scatter" or "all_reduce" for a bucket of `numel` elements whose largest owner
    holds `widest`: the one moving fewer bytes per rank (Note [Stage-2 bucket reduction])."""
    return "reduce_scatter" if world * widest < 2 * numel else "all_reduce"


Range = Tuple[int, int]


class Coverage:
    """The ranges of each gradient partition a direct landing has written since zero(), as
    disjoint sorted intervals per group: what a later span must add to instead of overwrite,
    and what finish() zeroes (the gaps)."""

    def __init__(self, groups: int):
        self.starts: List[List[int]] = [[] for _ in range(groups)]
        self.ends: List[List[int]] = [[] for _ in range(groups)]

    def claim(self, g: int, lo: int, hi: int) -> Tuple[List[Range], List[Range]]:
        """Marks [lo, hi) of group g written; returns (parts not written before, parts
        that were), each a list of [a, b) ranges in order."""
        starts, ends = self.starts[g], self.ends[g]
        # The intervals overlapping or touching [lo, hi): merged with it, so landing in
        # order keeps one interval per group.
        i = bisect.bisect_left(ends, lo)
        j = bisect.bisect_right(starts, hi)
        fresh, seen, at = [], [], lo
        for s, e in zip(starts[i:j], ends[i:j]):
            if s > at:
                fresh.append((at, s))
            a, b = max(s, at), min(e, hi)
            if a < b:
                seen.append((a, b))
            at = max(at, b)
        if at < hi:
            fresh.append((at, hi))
        new_lo = min(lo, starts[i]) if i < j else lo
        new_hi = max(hi, ends[j - 1]) if i < j else hi
        starts[i:j], ends[i:j] = [new_lo], [new_hi]
        return fresh, seen

    def gaps(self, g: int, numel: int) -> List[Range]:
        """The ranges of group g (numel elements) nothing has written."""
        out, at = [], 0
        for s, e in zip(self.starts[g], self.ends[g]):
            if s > at:
                out.append((at, s))
            at = max(at, e)
        if at < numel:
            out.append((at, numel))
        return out


class Landing:
    """How reduced gradients reach this rank's gradient partitions (`targets`): added in
    place on the device, or through the copy stage into host partitions, downloaded straight
    into 16-bit ones (Note [Gradients to an offloaded partition]). A span is (offset in the
    source, group, offset in that group's partition, elements).

    Note [A gradient that arrives in parts]
      A parameter's gradient hook may fire more than once in one backward: reentrant
      activation checkpointing (`torch.utils.checkpoint(..., use_reentrant=True)`) runs
      one inner backward per segment, so a weight used in two segments (a shared layer, a
      tied weight inside a checkpointed block) gets its gradient in two parts. Every part
      is summed, on every path: device partitions add; fp32 host partitions add on the
      host; a direct 16-bit landing overwrites only what no part wrote since zero() and adds
      the rest (through a slot, after the earlier part's download, which precedes it on
      the same lane). DeepSpeed refuses the second part ("gradient computed twice")."""

    def __init__(self, targets: List[torch.Tensor], stage=None):
        self.targets = targets
        self.stage = stage
        self.direct = stage is not None and bool(targets) and targets[0].dtype != torch.float32
        self.fresh = True  # nothing landed since zero(): a direct landing overwrites
        self._covered = Coverage(len(targets))  # written since zero() (direct landing)
        # group -> the device buffer that takes partition elements [0, len) instead of the
        # target (Note [Device-tier gradients stay on the device] in offload/device_tier.py)
        # (its target then holds only the rest: its element i is the partition's len + i)
        self.device_parts: Dict[int, torch.Tensor] = {}
        # listener(group, at, n, mark): partition elements [at, at + n) of `group` hold what
        # was landed into them, once the host waited for `mark` (None: at once); called
        # where a span's values reach the partition, on whichever thread lands them (the
        # step started during the backward, zero/speculate.py).
        self.listener = None

    def land(self, source: torch.Tensor, spans: List[Tuple[int, int, int, int]]) -> None:
        if self.device_parts:
            spans = self._land_on_device(source, spans)
        if not spans:
            return
        if self.stage is None:
            if not same_device(source.device, self.targets[0].device):  # stage-3 shards on the host
                source = source.to(self.targets[0].device)
            listener = self.listener
            for off, g, at, n in spans:
                self.targets[g][at : at + n].add_(source[off : off + n])
                if listener is not None:
                    listener(g, at, n, None)
            return
        if not (self.direct and self.fresh):
            self._through_slot(source, [(off, g, at, n, False) for off, g, at, n in spans])
            return
        # A direct landing: parts of a range already written since zero() (Note [A gradient
        # that arrives in parts]) are added; the rest is overwritten.
        overwrite, add = [], []
        for off, g, at, n in spans:
            fresh, seen = self._covered.claim(g, at, at + n)
            overwrite.extend((off + a - at, g, a, b - a) for a, b in fresh)
            add.extend((off + a - at, g, a, b - a, False) for a, b in seen)
        if source.dtype == self.targets[0].dtype:
            for off, g, at, n in overwrite:
                self.stage.download(source[off : off + n], self.targets[g][at : at + n])
            listener = self.listener
            if listener is not None and overwrite:
                mark = self.stage.download_mark()  # after every download just queued
                for _, g, at, n in overwrite:
                    listener(g, at, n, mark)
        else:  # converted on the host
            add = [(off, g, at, n, True) for off, g, at, n in overwrite] + add
        self._through_slot(source, add)

    def _land_on_device(self, source: torch.Tensor, spans) -> List[Tuple[int, int, int, int]]:
        """Adds each span's part below its group's device range into the device buffer, on
        the compute stream; returns the parts left for the targets, in target elements."""
        rest = []
        for off, g, at, n in spans:
            part = self.device_parts.get(g)
            d = 0 if part is None else part.numel()
            if at < d:
                m = min(n, d - at)
                part[at : at + m].add_(source[off : off + m])
                off, at, n = off + m, at + m, n - m
            if n:
                rest.append((off, g, at - d, n))
        return rest

    def _through_slot(self, source: torch.Tensor, spans) -> None:
        """Spans (off, group, at, n, overwrite) landed through the copy stage's slots: a
        source of another dtype, or a part added to what an earlier one wrote."""
        if not spans:
            return
        # One download per run of adjacent spans: the elements between runs (landed on the
        # device, or another rank's) do not cross.
        runs: List[list] = []
        for span in sorted(spans, key=lambda sp: sp[0]):
            if runs and span[0] <= runs[-1][1]:
                runs[-1][1] = max(runs[-1][1], span[0] + span[3])
                runs[-1][2].append(span)
            else:
                runs.append([span[0], span[0] + span[3], [span]])
        for lo, hi, run in runs:
            self.stage.to_host(source[lo:hi], functools.partial(self._landed, run, lo))

    def _landed(self, spans, base: int, at: int, chunk: torch.Tensor) -> None:
        """The overlap of each span with a landed chunk (source elements [base + at, ...)),
        added (widened when the partition is fp32) or, for an overwriting span, copied."""
        c_lo, c_hi = base + at, base + at + chunk.numel()
        listener = self.listener  # read once: take() may clear it from another thread
        for off, g, part_at, n, overwrite in spans:
            a, b = max(off, c_lo), min(off + n, c_hi)
            if a < b:
                lo = part_at + a - off
                target = self.targets[g][lo : lo + b - a]
                piece = chunk[a - c_lo : b - c_lo]
                if overwrite:
                    target.copy_(piece)
                else:
                    target.add_(piece)
                if listener is not None:
                    listener(g, lo, b - a, None)

    def drain(self) -> None:
        """Every span handed to the copy stage has landed; the backward's landing is done."""
        if self.stage is not None:
            self.stage.drain()
        self.finish()

    def finish(self) -> None:
        """After the first backward's direct landing: zeroes what no span wrote, so the
        partitions hold exactly this backward's gradients; later ones add."""
        if not (self.direct and self.fresh):
            return
        covered, self._covered, self.fresh = self._covered, Coverage(len(self.targets)), False
        for g, target in enumerate(self.targets):
            for lo, hi in covered.gaps(g, target.numel()):
                target[lo:hi].zero_()

    def zero(self) -> None:
        """No gradient: a direct landing's partitions are overwritten by the next backward
        (and what it leaves unwritten zeroed), others are cleared now."""
        for part in self.device_parts.values():
            part.zero_()
        if self.direct:
            self.fresh, self._covered = True, Coverage(len(self.targets))
        else:
            for t in self.targets:
                t.zero_()


def piece_spans(pieces: List["Piece"], relative: bool) -> List[Tuple[int, int, int, int]]:
    """Landing spans of a bucket's pieces: back to back in the source when `relative` (a
    reduce-scatter output), else at their bucket positions."""
    spans, pos = [], 0
    for p in pieces:
        n = p.hi - p.lo
        spans.append((pos if relative else p.lo, p.group, p.part_lo, n))
        pos += n
    return spans


class ReducerBase:
    """What every stage's gradient reduction shares: the Landing of reduced gradients in the
    partitions (through the copy stage when offloaded), the count and time of its
    collectives, and the buckets in flight.

    With overlap_comm a bucket's collective runs while autograd goes on; the bucket (its
    full-size gradients, on the device) lives until its reduced piece has landed. At most
    IN_FLIGHT buckets are kept in flight: each is landed as soon as its collective is seen
    complete, the oldest waited for when a newer one would exceed the limit, so neither the
    device memory nor the start of the offloaded landing grows with the model."""

    IN_FLIGHT = 2

    def __init__(self, targets: List[torch.Tensor], ctx, stage=None):
        self.targets = targets
        # With the optimizer offloaded, reduced gradients reach the host partitions through
        # the copy stage (Note [Gradients to an offloaded partition]).
        self.landing = Landing(targets, stage)
        self.stage = stage
        self.group = ctx.group
        self.world = ctx.world
        self.telemetry = ctx.telemetry
        # communication_data_type: the dtype gradients are summed over ranks in (the model's
        # unless set); pieces land in the partitions from it.
        self.comm_dtype = DTYPES[ctx.config.communication_data_type]
        self.collectives: Counter = Counter()  # kind -> count, for state_summary()
        self.late_rounds = 0  # backwards whose late gradient parts were reduced again
        self.overlap = ctx.config.zero_optimization.overlap_comm
        self._pending = []  # (work, finish) of asynchronous reductions, oldest first
        self.peak_in_flight = 0

    def _timed(self, kind: str, payload: torch.Tensor, collective, *args, **kwargs):
        """Runs `collective(*args, **kwargs)`, counting its payload and time."""
        start = time.perf_counter()
        work = collective(*args, group=self.group, **kwargs)
        self.telemetry.moved(
            kind, payload.numel() * payload.element_size(), time.perf_counter() - start
        )
        self.collectives[kind] += 1
        return work

    def summary(self) -> dict:
        return {"collectives": dict(self.collectives)}

    def settle_late(self, order, issue, device) -> None:
        """The end of a backward: the buckets some rank holds late gradient parts of are
        reduced again on every rank (Note [Buckets in one order on every rank] in
        bucket_order.py). `issue(items)` reduces one bucket's (key, part or None) list."""
        if self.world == 1:
            again = order.late_buckets()
        else:
            # On the host where the group has a host twin: the device read that waited for
            # the rest of backward is gone (Note [Agreements on the host] in comm/).
            host = comm.host_group(self.group)
            flags = order.late_flags(device if host is None else torch.device("cpu"))
            comm.all_reduce(flags, op=comm.ReduceOp.MAX, group=host or self.group)
            again = [b for b, flag in enumerate(self._host_flags(flags)) if flag > 0]
        for b in again:
            issue(order.take_late(b))
        self.late_rounds += bool(again)

    def _in_flight(self, work, finish) -> None:
        """A bucket's collective was issued: `finish()` lands it once `work` completes (at
        once when it ran synchronously: work None)."""
        if work is None:
            finish()
            return
        self._pending.append((work, finish))
        self._land_finished()

    def _land_finished(self) -> None:
        """Lands the buckets whose collective has completed, in order, and waits for the
        oldest while more than IN_FLIGHT are in flight."""
        pending = self._pending
        while pending and (len(pending) > self.IN_FLIGHT or pending[0][0].is_completed()):
            work, finish = pending.pop(0)
            work.wait()
            finish()
        self.peak_in_flight = max(self.peak_in_flight, len(pending))

    def _land_all(self) -> None:
        """Waits for every bucket in flight and lands it. comm's handles fail from wait()
        named: this rank, the collective and the rank that stopped answering. The list is
        dropped even then, so a failed step leaves no work behind to be waited on twice."""
        pending, self._pending = self._pending, []
        for work, finish in pending:
            work.wait()
            finish()

    @staticmethod
    def _host_flags(flags: torch.Tensor) -> list:
        """The late-part flags as a list, once a backward with several ranks (tests count the
        calls); a device-to-host read where the group has no host twin."""
        return flags.tolist()

    def drain(self) -> None:
        """Every gradient handed to the copy stage has reached the partitions."""
        self.landing.drain()

    def zero(self) -> None:
        self.landing.zero()


class _Reducer(ReducerBase):
    """Stages 1 and 2: gradients of params laid out in flat groups."""

    def __init__(self, flat_groups: List[FlatGroup], targets: List[torch.Tensor], ctx, stage=None):
        super().__init__(targets, ctx, stage)
        self.flat_groups = flat_groups
        self.rank = ctx.rank

    def _land(self, source: torch.Tensor, pieces: List[Piece], relative: bool) -> None:
        """This rank's pieces of `source` into its gradient partitions (Landing)."""
        self.landing.land(source, piece_spans(pieces, relative))


class Stage1Reducer(_Reducer):
    """Accumulates local gradients; one reduce-scatter per group per optimizer step."""

    def __init__(self, flat_groups, targets, ctx, stage=None):
        super().__init__(flat_groups, targets, ctx, stage)
        self.local = [torch.zeros_like(f.buffer, dtype=ctx.grad_accum_dtype) for f in flat_groups]
        self.accumulated = False  # gradients in `local` not yet reduced

    def on_grad(self, gi: int, slot: ParamSlot, grad: torch.Tensor) -> None:
        self.local[gi][slot.offset : slot.offset + slot.numel].add_(grad)
        self.accumulated = True

    def after_backward(self) -> None:
        pass

    def zero(self) -> None:
        """zero_grad: also what was accumulated locally and not yet reduced (a no_sync pass,
        or micro-steps before the boundary), or the next boundary would still add it."""
        super().zero()
        if self.accumulated:
            for local in self.local:
                local.zero_()
            self.accumulated = False

    def at_boundary(self) -> None:
        for gi, flat in enumerate(self.flat_groups):
            local = self.local[gi]
            if self.world > 1:
                send = local.to(self.comm_dtype)  # a copy when communication_data_type differs
                # On the gradients' device: NCCL needs both sides there (GPU data-path issue).
                out = torch.empty(flat.partition_numel, dtype=send.dtype, device=local.device)
                self._timed("reduce_scatter", send, comm.reduce_scatter_tensor, out, send)
            else:
                out = local[flat.partition_begin : flat.partition_begin + flat.partition_numel]
            self._land(out, [Piece(0, out.numel(), gi, 0)], relative=True)
            if self.stage is not None:
                # `local` is zeroed next: on the device, after its download has read it; the
                # next group's reduce-scatter goes on while this one crosses.
                self.stage.release_sources()
            local.zero_()
        self.accumulated = False
        self.drain()


class Stage2Reducer(_Reducer):
    """Bucketed reduction during backward; see Note [Stage-2 bucket reduction]. Buckets are
    planned and issued in one order on every rank (Note [Buckets in one order on every
    rank] in bucket_order.py), kept in flight as ReducerBase says."""

    def __init__(self, flat_groups, targets, ctx, stage=None):
        super().__init__(flat_groups, targets, ctx, stage)
        self.bucket_size = ctx.config.zero_optimization.reduce_bucket_size
        self.device = ctx.device
        keys = [(gi, i) for gi, flat in enumerate(flat_groups) for i in range(len(flat.slots))]
        self._slot_index = {
            id(s): (gi, i) for gi, flat in enumerate(flat_groups) for i, s in enumerate(flat.slots)
        }
        numel = {(gi, i): flat_groups[gi].slots[i].numel for gi, i in keys}
        self.order = BucketOrder(keys, numel, self.bucket_size)
        self.zero_filled = 0  # parameters reduced as zeros (no gradient on this rank)

    def on_grad(self, gi: int, slot: ParamSlot, grad: torch.Tensor) -> None:
        # A plain loss.backward()'s buckets are flushed by the after_backward its first hook
        # queued (Note [A plain loss.backward()] in zero/base.py).
        for b in self.order.put(self._slot_index[id(slot)], grad):
            self._issue(self.order.take(b))

    def flush(self) -> None:
        """Issues every bucket not issued yet, in plan order (the end of backward)."""
        for b in self.order.rest():
            self._issue(self.order.take(b))
        self.order.restart()

    def after_backward(self) -> None:
        self.flush()
        with self.telemetry.phase("reduce"):
            self.settle_late(self.order, self._issue, self.device)
            self._land_all()
            self.drain()
        if self.world > 1:
            self.order.replan(self.group, self.world)
        else:
            self.order.arrivals = None

    def at_boundary(self) -> None:
        # A step with no backward since zero(): a direct landing's partitions still hold the
        # last step's gradients until finish() zeroes them (a no-op after a backward).
        self.landing.finish()

    def zero(self) -> None:
        super().zero()
        self.order.drop_late()

    def summary(self) -> dict:
        return {
            **super().summary(),
            "peak_buckets_in_flight": self.peak_in_flight,
            "zero_filled": self.zero_filled,
            "replans": self.order.replans,
            "late_rounds": self.late_rounds,
        }

    def owner_pieces(self, bucket) -> List[List[Piece]]:
        """For every rank, the pieces of the bucket it owns (bucket order)."""
        pieces: List[List[Piece]] = [[] for _ in range(self.world)]
        pos = 0
        for gi, slot in bucket:
            flat = self.flat_groups[gi]
            for r in flat.owners(slot):
                start, end = flat.overlap(slot, r)
                if end > start:
                    part_lo = slot.offset + start - flat.ranges[r][0]
                    pieces[r].append(Piece(pos + start, pos + end, gi, part_lo))
            pos += slot.numel
        return pieces

    def _issue(self, items) -> None:
        """One bucket's gradients (None: zeros) reduced and landed."""
        bucket = [(gi, self.flat_groups[gi].slots[i]) for (gi, i), _ in items]
        grads = [g for _, g in items]
        if self.world == 1:
            present = [(b, g) for b, g in zip(bucket, grads) if g is not None]
            if not present:
                return
            flat = torch.cat([g for _, g in present]) if len(present) > 1 else present[0][1]
            self._land(flat, self.owner_pieces([b for b, _ in present])[self.rank], False)
            return
        flat = self._flatten(bucket, grads)
        pieces = self.owner_pieces(bucket)
        widest = widest_owner(pieces)
        if choose_collective(widest, flat.numel(), self.world) == "reduce_scatter":
            work, finish = self._reduce_scatter(flat, pieces, widest)
        else:
            if flat.dtype != self.comm_dtype:
                flat = flat.to(self.comm_dtype)
            elif len(bucket) == 1 and grads[0] is not None:
                flat = flat.clone()  # never reduce into param.grad
            work = self._timed("all_reduce", flat, comm.all_reduce, flat, async_op=self.overlap)
            finish = functools.partial(self._land, flat, pieces[self.rank], relative=False)
        self._in_flight(work, finish)

    def _flatten(self, bucket, grads) -> torch.Tensor:
        """The bucket's gradients back to back; a parameter without one is zeros, so every
        rank reduces the same elements."""
        present = [g for g in grads if g is not None]
        if len(present) == len(grads):
            return torch.cat(grads) if len(grads) > 1 else grads[0]
        self.zero_filled += len(grads) - len(present)
        like = present[0] if present else None
        dtype = like.dtype if like is not None else self.comm_dtype
        device = like.device if like is not None else self.device
        total = sum(slot.numel for _, slot in bucket)
        flat = torch.empty(total, dtype=dtype, device=device)
        at = 0
        for (_, slot), g in zip(bucket, grads):
            if g is None:
                flat[at : at + slot.numel].zero_()
            else:
                flat[at : at + slot.numel].copy_(g)
            at += slot.numel
        return flat

    def _reduce_scatter(self, flat: torch.Tensor, pieces, widest: int):
        staging = flat.new_zeros(self.world * widest, dtype=self.comm_dtype)
        for r, ps in enumerate(pieces):
            at = r * widest
            for p in ps:
                staging[at : at + p.hi - p.lo].copy_(flat[p.lo : p.hi])
                at += p.hi - p.lo
        out = staging.new_empty(widest)
        work = self._timed(
            "reduce_scatter",
            staging,
            comm.reduce_scatter_tensor,
            out,
            staging,
            async_op=self.overlap,
        )
        return work, functools.partial(self._land, out, pieces[self.rank], relative=True)
