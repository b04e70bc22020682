"""Muon over stage 1/2 partitions: tells the inner MuonWithAuxAdam where each matrix of a
Muon group lies in the flat group and how to gather the group's partitions (Note [Muon needs
the whole matrix] in ops/muon.py)."""

from __future__ import annotations

from typing import Callable, List

import torch

from .. import comm
from ..ops.muon import MuonWithAuxAdam, PartitionedMatrices
from .flat import FlatGroup


def _gatherer(flat: FlatGroup, group) -> Callable[[torch.Tensor], torch.Tensor]:
    """Every rank's partition of a tensor laid out as `flat`, as one flat-group tensor on the
    params' device (where the collective runs; an offloaded optimizer's tensors are host
    memory)."""
    world = flat.world

    def gather(part: torch.Tensor) -> torch.Tensor:
        if world == 1:
            return part
        src = part.to(flat.buffer.device)
        whole = torch.empty(world * src.numel(), dtype=src.dtype, device=src.device)
        comm.all_gather_into_tensor(whole, src, group=group)
        return whole

    return gather


def bind_partitions(inner: MuonWithAuxAdam, flats: List[FlatGroup], group) -> None:
    """Binds each Muon group's flat partition (its one parameter) to its layout."""
    if len(inner.param_groups) != len(flats):
        raise RuntimeError(
            f"MuonWithAuxAdam has {len(inner.param_groups)} param groups over "
            f"{len(flats)} flat groups"
        )
    for options, flat in zip(inner.param_groups, flats):
        if not options["use_muon"]:
            continue
        (partition,) = options["params"]
        layout = PartitionedMatrices(
            shapes=tuple(s.param.shape for s in flat.slots),
            offsets=tuple(s.offset for s in flat.slots),
            begin=flat.partition_begin,
            gather=_gatherer(flat, group),
        )
        inner.bind_partitions(partition, layout)
