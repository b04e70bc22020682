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
  With offload_optimizer the fp32 gradient partitions are in host memory. A reduced bucket
  (its reduce-scatter output, or the span of an all-reduced bucket holding this rank's
  pieces) is handed to the copy stage (offload/copy_stage.py) in the gradients' own dtype:
  it crosses on the download lane while backward goes on, and is added into the fp32
  partitions on the host when it has landed, so accumulation over micro-steps stays fp32
  and exact. after_backward (stage 2) and at_boundary (stage 1) drain the stage: the step
  never reads a partition with a bucket still in flight. Before, each bucket was a
  synchronous device-to-host copy through pageable memory (the stall of issue 11).
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from dataclasses import dataclass
from typing import List, Tuple

import torch

from .. import comm
from .flat import FlatGroup, ParamSlot
from .protocol import TrainingState


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


class _Reducer:
    def __init__(self, flat_groups: List[FlatGroup], targets: List[torch.Tensor], ctx, stage=None):
        self.flat_groups = flat_groups
        self.targets = targets
        # With the optimizer offloaded, reduced gradients reach the host partitions through
        # the copy stage (Note [Gradients to an offloaded partition]).
        self.stage = stage
        self.group = ctx.group
        self.world = ctx.world
        self.rank = ctx.rank
        self.telemetry = ctx.telemetry
        self.run = ctx.run
        self.collectives: Counter = Counter()  # kind -> count, for state_summary()

    def _timed(self, kind: str, payload: torch.Tensor, collective, *args, **kwargs):
        """Runs `collective(*args, **kwargs)`, counting its payload and time."""
        start = time.perf_counter()
        work = collective(*args, group=self.group, **kwargs)
        self.telemetry.moved(
            "comm", payload.numel() * payload.element_size(), time.perf_counter() - start
        )
        self.collectives[kind] += 1
        return work

    def summary(self) -> dict:
        return {"collectives": dict(self.collectives)}

    def _land(self, source: torch.Tensor, pieces: List[Piece], relative: bool) -> None:
        """Adds this rank's pieces of `source` into its fp32 partitions: directly, or, with
        a copy stage, once the span of `source` holding them has crossed to the host in its
        own dtype (widened there by the add)."""
        if self.stage is None:
            self._add(source, pieces, relative)
            return
        if not pieces:
            return
        if relative:
            lo, hi = 0, sum(p.hi - p.lo for p in pieces)
        else:
            lo, hi = min(p.lo for p in pieces), max(p.hi for p in pieces)
        self.stage.to_host(source[lo:hi], functools.partial(self._add_landed, pieces, relative, lo))

    def _add_landed(self, pieces, relative: bool, base: int, at: int, chunk: torch.Tensor):
        """The overlap of each piece with a landed chunk (source elements [base + at, ...))."""
        c_lo, c_hi = base + at, base + at + chunk.numel()
        pos = 0
        for p in pieces:
            n = p.hi - p.lo
            s_lo = pos if relative else p.lo
            pos += n
            a, b = max(s_lo, c_lo), min(s_lo + n, c_hi)
            if a < b:
                off = p.part_lo + a - s_lo
                self.targets[p.group][off : off + b - a].add_(chunk[a - c_lo : b - c_lo])

    def drain(self) -> None:
        """Every gradient handed to the copy stage has reached the partitions."""
        if self.stage is not None:
            self.stage.drain()


class Stage1Reducer(_Reducer):
    """Accumulates local gradients; one reduce-scatter per group per optimizer step."""

    def __init__(self, flat_groups, targets, ctx, stage=None):
        super().__init__(flat_groups, targets, ctx, stage)
        self.local = [torch.zeros_like(f.buffer) for f in flat_groups]

    def on_grad(self, gi: int, slot: ParamSlot, grad: torch.Tensor) -> None:
        self.local[gi][slot.offset : slot.offset + slot.numel].add_(grad)

    def after_backward(self) -> None:
        pass

    def at_boundary(self) -> None:
        for gi, flat in enumerate(self.flat_groups):
            local, target = self.local[gi], self.targets[gi]
            if self.world > 1:
                # On the gradients' device: NCCL needs both sides there (GPU data-path issue).
                out = torch.empty(flat.partition_numel, dtype=local.dtype, device=local.device)
                self._timed("reduce_scatter", local, comm.reduce_scatter_tensor, out, local)
            else:
                out = local[flat.partition_begin : flat.partition_begin + flat.partition_numel]
            if self.stage is None:
                target.add_(out.to(target.device, torch.float32))
            else:
                self._land(out, [Piece(0, out.numel(), gi, 0)], relative=True)
                self.drain()  # `local` is zeroed next
            local.zero_()


class Stage2Reducer(_Reducer):
    """Bucketed reduction during backward; see Note [Stage-2 bucket reduction]."""

    def __init__(self, flat_groups, targets, ctx, stage=None):
        super().__init__(flat_groups, targets, ctx, stage)
        zero = ctx.config.zero_optimization
        self.bucket_size = zero.reduce_bucket_size
        self.overlap = zero.overlap_comm
        self._bucket: List[Tuple[int, ParamSlot, torch.Tensor]] = []
        self._bucket_numel = 0
        self._pending = []  # (work, finish) of asynchronous reductions

    def on_grad(self, gi: int, slot: ParamSlot, grad: torch.Tensor) -> None:
        # A gradient from a bare loss.backward() would sit in a bucket nobody flushes.
        self.run.require(
            TrainingState.BACKWARD,
            what=(
                "ZeRO stage 2 received a gradient outside engine.backward(loss) (it reduces "
                "gradients as autograd produces them: call engine.backward(loss), not "
                "loss.backward())"
            ),
        )
        self._bucket.append((gi, slot, grad))
        self._bucket_numel += slot.numel
        if self._bucket_numel >= self.bucket_size:
            self.flush()

    def after_backward(self) -> None:
        self.flush()
        pending, self._pending = self._pending, []
        with self.telemetry.phase("reduce"):
            # comm's handles fail from wait() named: this rank, the collective and the rank
            # that stopped answering. The list is dropped even then, so a failed step leaves
            # no work behind to be waited on twice.
            for work, finish in pending:
                work.wait()
                finish()
            self.drain()

    def at_boundary(self) -> None:
        pass

    def owner_pieces(self, bucket) -> List[List[Piece]]:
        """For every rank, the pieces of the bucket it owns (bucket order)."""
        pieces: List[List[Piece]] = [[] for _ in range(self.world)]
        pos = 0
        for gi, slot, _ in bucket:
            flat = self.flat_groups[gi]
            for r in flat.owners(slot):
                start, end = flat.overlap(slot, r)
                if end > start:
                    part_lo = slot.offset + start - flat.ranges[r][0]
                    pieces[r].append(Piece(pos + start, pos + end, gi, part_lo))
            pos += slot.numel
        return pieces

    def flush(self) -> None:
        if not self._bucket:
            return
        bucket, self._bucket, self._bucket_numel = self._bucket, [], 0
        flat = torch.cat([g for _, _, g in bucket]) if len(bucket) > 1 else bucket[0][2]
        pieces = self.owner_pieces(bucket)
        if self.world == 1:
            self._land(flat, pieces[self.rank], relative=False)
            return
        widest = widest_owner(pieces)
        if choose_collective(widest, flat.numel(), self.world) == "reduce_scatter":
            work, finish = self._reduce_scatter(flat, pieces, widest)
        else:
            flat = flat if len(bucket) > 1 else flat.clone()  # never reduce into param.grad
            work = self._timed("all_reduce", flat, comm.all_reduce, flat, async_op=self.overlap)
            finish = functools.partial(self._land, flat, pieces[self.rank], relative=False)
        if work is None:
            finish()
        else:
            self._pending.append((work, finish))

    def _reduce_scatter(self, flat: torch.Tensor, pieces, widest: int):
        staging = flat.new_zeros(self.world * widest)
        for r, ps in enumerate(pieces):
            at = r * widest
            for p in ps:
                staging[at : at + p.hi - p.lo].copy_(flat[p.lo : p.hi])
                at += p.hi - p.lo
        out = flat.new_empty(widest)
        work = self._timed(
            "reduce_scatter",
            staging,
            comm.reduce_scatter_tensor,
            out,
            staging,
            async_op=self.overlap,
        )
        return work, functools.partial(self._land, out, pieces[self.rank], relative=True)

    def _add(self, source: torch.Tensor, pieces: List[Piece], relative: bool) -> None:
        """Adds this rank's pieces into its fp32 partitions; `relative`: `source` holds the
        pieces back to back (reduce-scatter output), else at their bucket positions."""
        if relative and self.targets:
            # All of it is ours: one copy to the partitions' device (with CPU offload, one
            # device-to-host transfer instead of one per piece).
            source = source.to(self.targets[0].device)
        at = 0
        for p in pieces:
            n = p.hi - p.lo
            chunk = source[at : at + n] if relative else source[p.lo : p.hi]
            target = self.targets[p.group][p.part_lo : p.part_lo + n]
            target.add_(chunk.to(target.device))
            at += n
