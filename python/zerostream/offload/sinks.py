"""Where an optimizer update writes a rank's 16-bit partition: the partition sinks.

Note [Partition sinks]
  After each update the fp32 master values of a piece [lo, hi) of a partition become its
  16-bit values. The partition is one of:
  - a tensor: on the compute device without the copy stage, or in host memory (offload_param
    cpu, or a machine without a GPU);
  - a DeviceSink (offload/copy_stage.py): a device partition written through the copy stage,
    a staging slot per piece, each piece crossing while the next is stepped;
  - a ShardSink (zero/stage3/param_swap.py): stage-3 shards in the param swap store, a host piece
    written out to disk at commit.
  The two sinks share one type, StagedSink: `staging(lo, hi)` hands out host memory for the
  piece and `commit(lo, hi)` sends it on; `piece` (DeviceSink) bounds the piece to a staging
  slot. A ShardSink also stands for a partition before any update (`materialize`,
  `read_range`), where the other partitions are plain tensors.
  Where the host memory of a piece is 16-bit and the master fp32 (`fused_target`), the fused
  CPU kernel writes it in the update pass itself (`param_copy`); otherwise `hand_on` copies
  the master's values afterwards (a 16-bit master is its own copy: Note [16-bit masters and
  states] in csrc/optim/step_types.h). Both optimizer paths (zero/sharded.py over host
  masters, offload/optimizer_swap.py over sub-groups swapped in from NVMe) go through these
  functions.
"""

from __future__ import annotations

import abc
from typing import Optional

import torch

from ..precision import COPY_DTYPES


class StagedSink(abc.ABC):
    """A partition the update writes through host staging (Note [Partition sinks])."""

    numel: int
    dtype: torch.dtype
    piece: Optional[int] = None  # elements per hand-off piece (a staging slot); None: any

    @abc.abstractmethod
    def staging(self, lo: int, hi: int) -> torch.Tensor:
        """Host memory for elements [lo, hi), written by the caller before commit."""

    @abc.abstractmethod
    def commit(self, lo: int, hi: int) -> None:
        """Sends the staged elements [lo, hi) on to where the partition lives."""

    def upload_from(self, lo: int, hi: int, host: torch.Tensor) -> bool:
        """Elements [lo, hi) straight from `host` (page-locked, unchanged until the copy
        stage's fence), without staging; False when this sink cannot (then stage them)."""
        return False


def numel(partition) -> int:
    return partition.numel() if isinstance(partition, torch.Tensor) else partition.numel


def values(partition) -> torch.Tensor:
    """A partition as a tensor (a ShardSink's shards are read in from the swap store)."""
    return partition if isinstance(partition, torch.Tensor) else partition.materialize()


def piece(sink, default: Optional[int] = None) -> int:
    """Elements per hand-off piece: a copy-stage slot of the sink's dtype, else `default`
    (the whole partition when not given)."""
    if isinstance(sink, StagedSink) and sink.piece is not None:
        return sink.piece
    return max(1, numel(sink) if default is None else default)


def fusable(sink, master_dtype: torch.dtype = torch.float32) -> bool:
    """Whether the CPU kernel can write the sink's 16-bit values in its update pass over a
    master of `master_dtype`: a sink's staging or a host partition, of a 16-bit dtype (not
    fp32 partitions, not device ones), beside an fp32 master (a 16-bit one is its own copy)."""
    on_host = isinstance(sink, StagedSink) or sink.device.type == "cpu"
    return on_host and sink.dtype in COPY_DTYPES and master_dtype == torch.float32


def fused_target(
    sink, lo: int, hi: int, master_dtype: torch.dtype = torch.float32
) -> Optional[torch.Tensor]:
    """Where the kernel updating a master of `master_dtype` writes elements [lo, hi) of a
    fusable sink (its staging is taken now), else None."""
    if not fusable(sink, master_dtype):
        return None
    return sink.staging(lo, hi) if isinstance(sink, StagedSink) else sink[lo:hi]


def hand_on(sink, lo: int, hi: int, master: torch.Tensor, fused: bool, stable: bool) -> None:
    """Elements [lo, hi) of a partition from their updated `master` values. `fused`: the
    kernel was given fused_target(sink, lo, hi, master.dtype) and wrote them there, which is
    committed now.
    `stable`: `master` is page-locked memory that stays unchanged until the copy stage's
    fence (host masters), so an fp32 device partition uploads straight from it."""
    if fused and fusable(sink, master.dtype):
        if isinstance(sink, StagedSink):
            sink.commit(lo, hi)
    elif not (stable and isinstance(sink, StagedSink) and sink.upload_from(lo, hi, master)):
        write_piece(sink, lo, hi, master)


def write_piece(sink, lo: int, hi: int, values: torch.Tensor) -> None:
    """Elements [lo, hi) of a partition, copied from `values` (converted to its dtype)."""
    if isinstance(sink, StagedSink):
        sink.staging(lo, hi).copy_(values)
        sink.commit(lo, hi)
    else:
        sink[lo:hi].copy_(values)
