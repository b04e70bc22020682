"""Stage-3 gradient reduction: full gradients of whole parameters, in the order autograd
finishes them, are reduce-scattered in buckets of `reduce_bucket_size` elements so that each
rank receives the sum over ranks of its own shard of each parameter, landed in its gradient
partition as stages 1 and 2 land theirs (Landing, zero/grad_reduce.py).

A bucket of parameters p1..pn is laid out rank-major: row r holds rank r's shard of p1, then
of p2, ... (each shard ceil(numel/world) elements, zero padded), so one reduce-scatter of
world*S elements leaves each rank its S elements, in the order of its gradient partition.

Note [One rank on the host lands each gradient as it comes]
  With one rank there is nothing to reduce and, on the CPU (no copy stage, or the host's
  own, whose copies are done when issued), nothing to download: a bucket would be a copy of
  every gradient into a fresh buffer (its pages faulted in anew each step: 1.3 s of a
  4-layer, hidden-2560 slice's step) before the landing copies or adds it into the
  partition. So each gradient is landed as autograd finishes it, by the same landing (the
  same bits), and is freed then instead of waiting in a bucket. A device's copy stage (a
  GPU, or the simulated device) keeps the buckets: one download a bucket, not one a
  parameter.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

from ... import comm
from ..bucket_order import BucketOrder
from ..grad_reduce import ReducerBase
from .param import ZeroParam


class Stage3Reducer(ReducerBase):
    """Buckets planned and issued in one order on every rank (Note [Buckets in one order on
    every rank] in zero/bucket_order.py)."""

    def __init__(
        self,
        slots: Dict[int, Tuple[int, int]],
        params: Dict[int, ZeroParam],
        targets: List[torch.Tensor],
        bucket_size: int,
        ctx,
        stage=None,
    ):
        """`slots[ds_id]` = (group, offset of the param's shard in that group's partition);
        `params[ds_id]` its ZeroParam; `targets` the gradient partitions; `stage` the copy
        stage that takes reduced shards to host partitions (Note [Gradients to an offloaded
        partition] in zero/grad_reduce.py)."""
        super().__init__(targets, ctx, stage)
        self.slots = slots
        self.params = params
        self.device = ctx.device
        self.bucket_size = max(1, bucket_size)
        keys = sorted(slots)  # ds_ids: the params' registration order
        self.order = BucketOrder(keys, {k: params[k].numel for k in keys}, self.bucket_size)
        self.reduced_numel = 0
        self.landed_directly = 0  # gradients landed without a bucket (Note above)
        self.zero_filled = 0  # params reduced as zeros (no gradient on this rank)
        self._open = False  # gradients taken since the last end of backward
        # The coordinator, while a traced pass runs with several ranks: it places the
        # buckets' reduce-scatters in the sequence of gathers every rank shares.
        self.sequencer = None

    def add(self, zp: ZeroParam, grad: torch.Tensor) -> None:
        """Takes a parameter's full gradient (the caller drops its own reference)."""
        if zp.ds_id not in self.slots:
            raise RuntimeError(
                f"ZeRO-3: gradient for param ds_id={zp.ds_id} {tuple(zp.shape)} that is in "
                f"no optimizer param group"
            )
        if self._lands_directly():
            group, at = self.slots[zp.ds_id]  # Note [One rank on the host lands each ...]
            self.landing.land(grad.reshape(-1), [(0, group, at, zp.numel)])
            self.reduced_numel += zp.numel
            self.landed_directly += 1
            return
        self._open = True
        for b in self.order.put(zp.ds_id, grad.reshape(-1)):
            if self.sequencer is not None and self.sequencer.bucket_ready(b):
                continue  # issued where the ranks' gather sequence places it
            self._issue(self.order.take(b))

    def issue_next(self, b: int) -> None:
        """Issues bucket b, the next (the gather sequence reached it: Note [One gather
        sequence on every rank] in coordinator.py), whatever gradients this rank holds for
        it; parts that come later are late parts."""
        self._open = True
        self._issue(self.order.take(b))

    def _lands_directly(self) -> bool:
        """One rank whose gradients need no device copy: no copy stage, or the host's own
        (lanes "host": a copy is done when issued); no device-tier gradients."""
        stage = self.landing.stage
        return (
            self.world == 1
            and (stage is None or stage.lanes.kind == "host")
            and not self.landing.device_parts
        )

    def end_backward(self) -> None:
        """Every bucket not issued yet, in plan order, on every rank, whatever this rank's
        backward produced; after the first backward the plan follows rank 0's arrivals."""
        if self._lands_directly():
            return
        for b in self.order.rest():
            self._issue(self.order.take(b))
        self.settle_late(self.order, self._issue, self.device)
        self._land_all()
        self.order.restart()
        self._open = False
        if self.world > 1 and self.sequencer is None:
            self.order.replan(self.group, self.world)
        else:
            # With the coordinator placing the buckets, the plan stays as it is: the traces
            # recorded since hold its buckets (Note [One gather sequence on every rank]).
            self.order.arrivals = None

    def flush(self) -> None:
        """The end of a backward that ran no after_backward (a plain loss.backward() before
        the step, a coalesced block): issues what is left if gradients came since."""
        if self._open:
            self.end_backward()

    def zero(self) -> None:
        super().zero()
        self.order.drop_late()

    def _issue(self, items: List[Tuple[int, Optional[torch.Tensor]]]) -> None:
        """One bucket: with several ranks, one reduce-scatter in the communication dtype
        (a param without a gradient here as zeros), whatever this rank's gradients were;
        with one, a landing per gradient dtype of what this rank has."""
        if self.world > 1:
            absent = sum(1 for _, g in items if g is None)
            self.zero_filled += absent
            self._reduce([(self.params[k], g) for k, g in items])
            return
        by_dtype: Dict[torch.dtype, List[Tuple[ZeroParam, Optional[torch.Tensor]]]] = {}
        for k, g in items:
            if g is not None:
                by_dtype.setdefault(g.dtype, []).append((self.params[k], g))
        for run in by_dtype.values():
            self._reduce(run)

    def _reduce(self, items: List[Tuple[ZeroParam, Optional[torch.Tensor]]]) -> None:
        world = self.world
        total = sum(zp.shard_numel for zp, _ in items)
        dtype = self.comm_dtype if world > 1 else items[0][1].dtype  # communication_data_type
        device = next((g.device for _, g in items if g is not None), self.device)
        # Row r holds every rank r shard; only the padding past a parameter's last element
        # is zeroed (a memset of the whole bucket was a pass over it on the host).
        send = torch.empty(world, total, dtype=dtype, device=device)
        off = 0
        for zp, g in items:
            k, n = zp.shard_numel, zp.numel
            if g is None:
                send[:, off : off + k].zero_()
                off += k
                continue
            whole = n // k if k else 0
            rest = n - whole * k
            if whole:
                send[:whole, off : off + k].copy_(g[: whole * k].view(whole, k))
            if rest:
                send[whole, off : off + rest].copy_(g[whole * k :])
            if whole < world:  # the padding: the rest of the partial row, the empty rows
                send[whole, off + rest : off + k].zero_()
                send[whole + 1 :, off : off + k].zero_()
            off += k
        flat = send.view(-1)
        work = None
        if world > 1:
            # With overlap_comm (stage 3's default) the reduce-scatter runs while autograd
            # goes on, IN_FLIGHT buckets at most (ReducerBase); `out` is read only after
            # its wait.
            out = torch.empty(total, dtype=flat.dtype, device=flat.device)
            work = self._timed(
                "reduce_scatter",
                flat,
                comm.reduce_scatter_tensor,
                out,
                flat,
                async_op=self.overlap,
            )
        else:
            out = flat
        spans, off = [], 0  # (where in `out`, group, where in its partition, elements)
        for zp, _ in items:
            group, at = self.slots[zp.ds_id]
            spans.append((off, group, at, zp.shard_numel))
            off += zp.shard_numel
        self.reduced_numel += sum(zp.numel for zp, _ in items)
        # `flat` rides along: the send buffer lives until its collective is waited for.
        self._in_flight(work, lambda: self.landing.land(out, spans) or flat)

    def summary(self) -> dict:
        return {
            **super().summary(),
            "reduced_numel": self.reduced_numel,
            "landed_directly": self.landed_directly,
            "zero_filled": self.zero_filled,
            "replans": self.order.replans,
            "late_rounds": self.late_rounds,
            "peak_buckets_in_flight": self.peak_in_flight,
        }
