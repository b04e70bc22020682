"""Muon over ZeRO partitions: tells the inner MuonWithAuxAdam which pieces of which matrices
each Muon group's partition holds and how to gather them whole (Note [Muon needs the whole
matrix] in ops/muon.py). Stage 1/2 partitions are slices of the flat group; a stage-3
partition is its params' shards, one after the other."""

from __future__ import annotations

from typing import Callable, List, Sequence, Tuple

import torch

from .. import comm
from ..ops.muon import MatrixPiece, MuonWithAuxAdam, PartitionedMatrices

# (the whole flat tensor of every rank's partitions) -> each piece's whole matrix
_Cut = Callable[[torch.Tensor], List[torch.Tensor]]


def _gatherer(world: int, group, device: torch.device, cut: _Cut):
    """All-gathers a partition-shaped tensor on `device` (where the collective runs; an
    offloaded optimizer's tensors are host memory) and cuts the matrices out of it."""

    def gather(part: torch.Tensor) -> List[torch.Tensor]:
        if world == 1:
            return cut(part)
        src = part.to(device)
        whole = torch.empty(world * src.numel(), dtype=src.dtype, device=device)
        comm.all_gather_into_tensor(whole, src, group=group)
        return cut(whole)

    return gather


def _bind(
    inner: MuonWithAuxAdam, layouts: Sequence[Tuple[tuple, _Cut, list]], world, group, device
):
    if len(inner.param_groups) != len(layouts):
        raise RuntimeError(
            f"MuonWithAuxAdam has {len(inner.param_groups)} param groups over "
            f"{len(layouts)} partitions"
        )
    for options, (pieces, cut, shapes) in zip(inner.param_groups, layouts):
        if options["use_muon"]:
            # Every rank checks every matrix of the group (not only its pieces): all raise.
            vectors = [tuple(shape) for shape in shapes if len(shape) < 2]
            if vectors:
                raise ValueError(
                    f"Muon: a use_muon group holds a parameter of shape {vectors[0]}, not a "
                    "matrix; Muon orthogonalises matrices (give it use_muon=False)"
                )
            (partition,) = options["params"]
            layout = PartitionedMatrices(pieces, _gatherer(world, group, device, cut))
            inner.bind_partitions(partition, layout)


def bind_flat_groups(inner: MuonWithAuxAdam, flats, group) -> None:
    """Stages 1/2: a partition is a slice of the flat group (zero/flat.py); the gathered
    tensor is the whole flat group, each matrix a contiguous run of it."""
    layouts = []
    for flat in flats:
        slots = [(s, *flat.overlap(s)) for s in flat.slots]
        slots = [(s, lo, hi) for s, lo, hi in slots if hi > lo]
        pieces = tuple(
            MatrixPiece(s.param.shape, s.offset + lo - flat.partition_begin, lo, hi)
            for s, lo, hi in slots
        )

        def cut(whole, slots=slots):
            return [whole[s.offset : s.offset + s.numel] for s, _, _ in slots]

        layouts.append((pieces, cut, [s.param.shape for s in flat.slots]))
    device = flats[0].buffer.device if flats else torch.device("cpu")
    _bind(inner, layouts, flats[0].world if flats else 1, group, device)


def bind_shard_groups(inner: MuonWithAuxAdam, groups, world, rank, group, device) -> None:
    """Stage 3: a partition is its params' shards (stage3/param.py: rank r holds elements
    [r * shard_numel, r * shard_numel + shard_valid) of each); the gathered tensor is every
    rank's partition in rank order, so a matrix is its shard's column in a (world, partition)
    view."""
    layouts = []
    for zps in groups:
        starts, off = [], 0
        for zp in zps:
            starts.append(off)
            off += zp.shard_numel
        size = off
        held = [(zp, start) for zp, start in zip(zps, starts) if zp.shard_valid > 0]
        pieces = tuple(
            MatrixPiece(
                zp.shape, start, rank * zp.shard_numel, rank * zp.shard_numel + zp.shard_valid
            )
            for zp, start in held
        )

        def cut(whole, held=held, size=size):
            rows = whole.view(-1, size)
            return [
                rows[:, start : start + zp.shard_numel].reshape(-1)[: zp.numel]
                for zp, start in held
            ]

        layouts.append((pieces, cut, [zp.shape for zp in zps]))
    _bind(inner, layouts, world, group, device)
