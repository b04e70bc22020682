"""`deepspeed.runtime.comm.coalesced_collectives`: DeepSpeed's `reduce_scatter_coalesced`
over zerostream's collectives, and `all_to_all_quant_reduce`, ZeRO++'s quantized gradient
reduction, refused by name (ZeRO++ is not implemented).

reduce_scatter_coalesced(tensors, group): each tensor, flattened, is cut into world_size
chunks of ceil(numel / world_size) elements (the last ones shorter, or empty); rank r gets
chunk r of every tensor, averaged over the ranks. One reduce-scatter moves all of them: the
send buffer holds, for each rank in turn, its chunk of every tensor (padded to the chunk
size), so each rank's slice of the buffer is exactly what it receives.
"""

from __future__ import annotations

import math
from typing import List

import torch

from zerostream import comm


def reduce_scatter_coalesced(tensors: List[torch.Tensor], group=None) -> List[torch.Tensor]:
    """This rank's chunk of each tensor's average over the ranks (module docstring)."""
    tensors = list(tensors)
    if not tensors:
        return []
    dtype, device = tensors[0].dtype, tensors[0].device
    for i, t in enumerate(tensors):
        if t.dtype != dtype or t.device != device:
            raise ValueError(
                f"reduce_scatter_coalesced: tensor {i} is {t.dtype} on {t.device}; every "
                f"tensor must be {dtype} on {device} (one buffer carries them all)"
            )
    world, rank = comm.get_world_size(group), comm.get_rank(group)
    chunks = [math.ceil(t.numel() / world) for t in tensors]
    width = sum(chunks)
    send = torch.zeros(world * width, dtype=dtype, device=device)
    for r in range(world):
        at = r * width
        for t, c in zip(tensors, chunks):
            piece = t.reshape(-1)[r * c : (r + 1) * c]
            send[at : at + piece.numel()].copy_(piece)
            at += c
    received = torch.empty(width, dtype=dtype, device=device)
    comm.reduce_scatter_tensor(received, send, group=group)
    received.div_(world)
    out, at = [], 0
    for t, c in zip(tensors, chunks):
        mine = max(0, min(c, t.numel() - rank * c))
        out.append(received[at : at + mine])
        at += c
    return out


def all_to_all_quant_reduce(tensors: List[torch.Tensor], groups: dict) -> List[torch.Tensor]:
    """ZeRO++'s quantized gradient all-to-all (zero_quantized_gradients): not implemented."""
    raise NotImplementedError(
        "all_to_all_quant_reduce: ZeRO++'s quantized gradient reduction "
        "(zero_optimization.zero_quantized_gradients) is not implemented by zerostream"
    )


__all__ = ["all_to_all_quant_reduce", "reduce_scatter_coalesced"]
