"""Whole 16-bit weights out of a ZeRO-3 model: the consolidated state dict DeepSpeed's
`_zero3_consolidated_16bit_state_dict` returns (what `save_16bit_model` writes, and what Hugging
Face Accelerate asks for when saving a ZeRO-3 model)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional

import torch

from ... import comm
from .gathered import GatheredParameters


def consolidated_state_dict(
    module: torch.nn.Module, rank: int = 0, exclude_frozen_parameters: bool = False
) -> Optional["OrderedDict[str, torch.Tensor]"]:
    """Every parameter gathered one at a time (all ranks must call this; the gathers are
    collectives), copied to host memory on global rank `rank` only; other ranks get None.
    Tied parameters appear under each of their names, as in `module.state_dict()`."""
    keep = comm.get_rank() == rank
    out: "OrderedDict[str, torch.Tensor]" = OrderedDict()
    copies = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        if exclude_frozen_parameters and not p.requires_grad:
            continue
        if id(p) not in copies:
            with GatheredParameters(p):
                copies[id(p)] = p.detach().cpu().clone() if keep else None
        if keep:
            out[name] = copies[id(p)]
    if not keep:
        return None
    for name, buf in module.named_buffers():
        leaf, _, attr = name.rpartition(".")
        owner = module.get_submodule(leaf) if leaf else module
        if attr not in getattr(owner, "_non_persistent_buffers_set", ()):
            out[name] = buf.detach().cpu().clone()
    return out
