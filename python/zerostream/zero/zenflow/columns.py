"""The important columns of each parameter and their gradients, from the partitioned
gradient every rank holds a piece of.

Note [ZenFlow columns]: a 2-D parameter W of shape (R, C) (a Linear's (out, in)) is split into
its C columns W[:, c]; a column's importance is the L1 norm of its averaged gradient (sum
over the R rows of |g|), and the int(topk_ratio * C) largest are selected, as DeepSpeed
does. A 1-D parameter (bias, norm weight) counts as wholly selected. DeepSpeed flattens 2-D
parameters transposed, so columns are contiguous, and selects within each rank's piece of a
parameter (a column cut by a partition boundary is never selected, and the count is per
piece); zerostream's partitions keep the row-major layout, so each rank sums |g| over the
rows it owns for every column and one all-reduce gives every rank the whole parameter's
column norms: the selection is the whole parameter's, the same for any number of ranks
(DeepSpeed's with one rank). The selected columns' gradients reach every rank the same
way: each rank writes the elements it owns, zeros elsewhere, and one all-reduce adds them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch

from ... import comm
from ..flat import FlatGroup, ParamSlot


@dataclass(frozen=True)
class OwnedPiece:
    """One parameter's elements [lo, hi) that this rank's partition of group `group` holds,
    from `start` in the partition."""

    group: int
    slot: ParamSlot
    lo: int
    hi: int
    start: int

    @property
    def shape(self) -> torch.Size:
        return self.slot.param.shape

    @property
    def is_matrix(self) -> bool:
        return self.slot.param.dim() == 2


def owned_pieces(flat_groups: List[FlatGroup]) -> List[OwnedPiece]:
    """Every parameter of every group (owned by this rank or not: each takes part in the
    collectives), with the part this rank owns (lo == hi when none)."""
    pieces = []
    for gi, flat in enumerate(flat_groups):
        for slot in flat.slots:
            lo, hi = flat.overlap(slot)
            pieces.append(OwnedPiece(gi, slot, lo, hi, slot.offset + lo - flat.partition_begin))
    return pieces


class ColumnSelector:
    """Selects columns and gathers the selected gradients (Note [ZenFlow columns])."""

    def __init__(self, flat_groups: List[FlatGroup], topk_ratio: float, ctx):
        self.pieces = owned_pieces(flat_groups)
        self.topk_ratio = topk_ratio
        self.ctx = ctx
        for p in self.pieces:
            if p.slot.param.dim() > 2:
                raise NotImplementedError(
                    f"zero_optimization.zenflow: a parameter of shape {tuple(p.shape)} (group "
                    f"{p.group}); ZenFlow selects columns of 2-D parameters and takes 1-D ones "
                    "whole (DeepSpeed's ZenFlow handles no other shapes either)"
                )
        # Selected column indices of each 2-D parameter (sorted), by piece index; None before
        # the first selection.
        self.indices: Optional[List[Optional[torch.Tensor]]] = None

    def _whole(self, piece: OwnedPiece, grads: List[torch.Tensor]) -> torch.Tensor:
        """The parameter's gradient in fp32 on the host, zero outside this rank's piece."""
        full = torch.zeros(piece.slot.numel, dtype=torch.float32)
        n = piece.hi - piece.lo
        if n > 0:
            src = grads[piece.group][piece.start : piece.start + n]
            full[piece.lo : piece.hi].copy_(src)
        return full.view(piece.shape)

    def _all_reduce(self, values: torch.Tensor) -> torch.Tensor:
        if self.ctx.world == 1 or values.numel() == 0:
            return values
        on_device = values.to(self.ctx.device)
        comm.all_reduce(on_device, group=self.ctx.group)
        return on_device.cpu()

    def select(self, grads: List[torch.Tensor]) -> None:
        """Picks each 2-D parameter's columns from this step's gradient partitions."""
        sums = [self._whole(p, grads).abs().sum(dim=0) for p in self.pieces if p.is_matrix]
        total = self._all_reduce(torch.cat(sums)) if sums else torch.zeros(0)
        indices: List[Optional[torch.Tensor]] = []
        at = 0
        for p in self.pieces:
            if not p.is_matrix:
                indices.append(None)
                continue
            cols = p.shape[1]
            k = int(self.topk_ratio * cols)
            norms = total[at : at + cols]
            at += cols
            top = torch.topk(norms, k).indices if k > 0 else torch.zeros(0, dtype=torch.long)
            indices.append(torch.sort(top).values)
        self.indices = indices

    def gather(self, grads: List[torch.Tensor], scale: float) -> List[torch.Tensor]:
        """Every parameter's selected gradient times `scale` (1-D: the whole gradient; 2-D:
        shape (R, k)), on every rank, in fp32 on the host."""
        if self.indices is None:
            raise RuntimeError("ZenFlow: selected gradients asked for before any selection")
        parts = []
        for p, idx in zip(self.pieces, self.indices):
            whole = self._whole(p, grads)
            parts.append(whole if idx is None else whole[:, idx])
        flat = self._all_reduce(torch.cat([t.reshape(-1) for t in parts]))
        out, at = [], 0
        for t in parts:
            out.append(flat[at : at + t.numel()].view_as(t).mul(scale))
            at += t.numel()
        return out
