"""Where an optimizer update writes a rank's 16-bit partition: the partition sinks.

Note [Partition sinks]
  After each update the fp32 master values of a piece [lo, hi) of a partition become its
  16-bit values. The partition is one of:
  - a tensor: on the compute device without the copy stage, or in host memory (offload_param
    cpu, or a machine without a GPU);
  - a DeviceSink (offload/copy_stage.py): a device partition written through the copy stage,
    a staging slot per piece, each piece crossing while the next is stepped;
  - a ShardSink (offload/param_swap.py): stage-3 shards in the param swap store, a host piece
    written out to disk at commit.
  The two sinks share one protocol: `staging(lo, hi)` hands out host memory for the piece and
  `commit(lo, hi)` sends it on; `piece` (DeviceSink) bounds the piece to a staging slot.
  Where the host memory of a piece is 16-bit (`fused_target`), the fused CPU kernel writes it
  in the update pass itself (`param_copy`); otherwise `hand_on` copies the fp32 values
  afterwards. Both optimizer paths (zero/sharded.py over host masters, offload/
  optimizer_swap.py over sub-groups swapped in from NVMe) go through these functions.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..ops._cpu_optimizer import COPY_DTYPES


def numel(partition) -> int:
    return partition.numel if hasattr(partition, "materialize") else partition.numel()


def values(partition) -> torch.Tensor:
    """A partition as a tensor (a ShardSink's shards are read in from the swap store)."""
    return partition.materialize() if hasattr(partition, "materialize") else partition


def piece(sink, default: Optional[int] = None) -> int:
    """Elements per hand-off piece: a copy-stage slot of the sink's dtype, else `default`
    (the whole partition when not given)."""
    if hasattr(sink, "piece"):
        return sink.piece
    return max(1, numel(sink) if default is None else default)


def fusable(sink) -> bool:
    """Whether the CPU kernel can write the sink's 16-bit values in its update pass: a sink's
    staging or a host partition, of a 16-bit dtype (not fp32 partitions, not device ones)."""
    on_host = hasattr(sink, "staging") or sink.device.type == "cpu"
    return on_host and sink.dtype in COPY_DTYPES


def fused_target(sink, lo: int, hi: int) -> Optional[torch.Tensor]:
    """Where the kernel writes elements [lo, hi) of a fusable sink (its staging is taken
    now), else None."""
    if not fusable(sink):
        return None
    return sink.staging(lo, hi) if hasattr(sink, "staging") else sink[lo:hi]


def hand_on(sink, lo: int, hi: int, master: torch.Tensor, fused: bool, stable: bool) -> None:
    """Elements [lo, hi) of a partition from their updated fp32 `master` values. `fused`: the
    kernel already wrote them into fused_target(sink, lo, hi), which is committed now.
    `stable`: `master` is page-locked memory that stays unchanged until the copy stage's
    fence (host masters), so an fp32 device partition uploads straight from it."""
    from .copy_stage import DeviceSink

    if fused and fusable(sink):
        if hasattr(sink, "commit"):
            sink.commit(lo, hi)
    elif stable and isinstance(sink, DeviceSink) and sink.dtype == master.dtype:
        sink.upload(lo, hi, master)
    else:
        write_piece(sink, lo, hi, master)


def write_piece(sink, lo: int, hi: int, values: torch.Tensor) -> None:
    """Elements [lo, hi) of a partition, copied from `values` (converted to its dtype)."""
    if hasattr(sink, "staging"):
        sink.staging(lo, hi).copy_(values)
        sink.commit(lo, hi)
    else:
        sink[lo:hi].copy_(values)
