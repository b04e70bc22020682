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

from typing import Dict, List, Tuple

import torch

from ... import comm
from ..grad_reduce import ReducerBase
from .param import ZeroParam


class Stage3Reducer(ReducerBase):
    def __init__(
        self,
        slots: Dict[int, Tuple[int, int]],
        targets: List[torch.Tensor],
        bucket_size: int,
        ctx,
        stage=None,
    ):
        """`slots[ds_id]` = (group, offset of the param's shard in that group's partition);
        `targets` the gradient partitions; `stage` the copy stage that takes reduced shards
        to host partitions (Note [Gradients to an offloaded partition] in
        zero/grad_reduce.py)."""
        super().__init__(targets, ctx, stage)
        self.slots = slots
        self.bucket_size = max(1, bucket_size)
        self.pending: List[Tuple[ZeroParam, torch.Tensor]] = []
        self.pending_numel = 0
        self.reduced_numel = 0
        self.landed_directly = 0  # gradients landed without a bucket (Note above)

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
        self.pending.append((zp, grad.reshape(-1)))
        self.pending_numel += zp.numel
        if self.pending_numel >= self.bucket_size:
            self.flush()

    def _lands_directly(self) -> bool:
        """One rank whose gradients need no device copy: no copy stage, or the host's own
        (lanes "host": a copy is done when issued); no device-tier gradients."""
        stage = self.landing.stage
        return (
            self.world == 1
            and (stage is None or stage.lanes.kind == "host")
            and not self.landing.device_parts
        )

    def flush(self) -> None:
        """Reduce-scatters the pending gradients into the fp32 partitions."""
        if not self.pending:
            return
        pending, self.pending, self.pending_numel = self.pending, [], 0
        by_dtype: Dict[torch.dtype, List[Tuple[ZeroParam, torch.Tensor]]] = {}
        for zp, g in pending:
            by_dtype.setdefault(g.dtype, []).append((zp, g))
        for items in by_dtype.values():
            self._reduce(items)

    def _reduce(self, items: List[Tuple[ZeroParam, torch.Tensor]]) -> None:
        world = self.world
        total = sum(zp.shard_numel for zp, _ in items)
        grad0 = items[0][1]
        dtype = self.comm_dtype if world > 1 else grad0.dtype  # communication_data_type
        # Row r holds every rank r shard; only the padding past a parameter's last element
        # is zeroed (a memset of the whole bucket was a pass over it on the host).
        send = torch.empty(world, total, dtype=dtype, device=grad0.device)
        off = 0
        for zp, g in items:
            k, n = zp.shard_numel, zp.numel
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
        if world > 1:
            out = torch.empty(total, dtype=flat.dtype, device=flat.device)
            self._timed("reduce_scatter", flat, comm.reduce_scatter_tensor, out, flat)
        else:
            out = flat
        spans, off = [], 0  # (where in `out`, group, where in its partition, elements)
        for zp, _ in items:
            group, at = self.slots[zp.ds_id]
            spans.append((off, group, at, zp.shard_numel))
            off += zp.shard_numel
        self.landing.land(out, spans)
        self.reduced_numel += sum(zp.numel for zp, _ in items)

    def summary(self) -> dict:
        return {
            **super().summary(),
            "reduced_numel": self.reduced_numel,
            "landed_directly": self.landed_directly,
        }
