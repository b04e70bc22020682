"""`deepspeed.checkpoint.utils`."""

from __future__ import annotations

import os
from typing import Any

import torch

_CPU = torch.device("cpu")


def clone_tensors_for_torch_save(item: Any, device: torch.device = _CPU) -> Any:
    """A copy of `item` (tensors inside dicts, lists and tuples) whose tensors are detached
    clones on `device`, so torch.save writes each tensor's own bytes instead of the whole
    storage a view shares (a shard of a flat buffer would otherwise save the buffer)."""
    if torch.is_tensor(item):
        return item.detach().clone().to(device)
    if isinstance(item, dict):
        return type(item)((k, clone_tensors_for_torch_save(v, device)) for k, v in item.items())
    if isinstance(item, (list, tuple)):
        cloned = [clone_tensors_for_torch_save(v, device) for v in item]
        return type(item)(cloned) if not hasattr(item, "_fields") else type(item)(*cloned)
    return item


def get_model_ckpt_name_for_rank(base_folder: str, mp_rank_str: str) -> str:
    """The model-states file of a model-parallel rank in a tag folder
    (`mp_rank_{mp_rank_str}_model_states.pt`, DeepSpeed's layout)."""
    return os.path.join(base_folder, f"mp_rank_{mp_rank_str}_model_states.pt")


def get_zero_ckpt_name_for_rank(base_folder: str, dp_rank: int, mp_rank: int) -> str:
    """The ZeRO optimizer-states file of a data-parallel rank (DeepSpeed's layout)."""
    return os.path.join(
        base_folder, f"zero_pp_rank_{dp_rank}_mp_rank_{mp_rank:02d}_optim_states.pt"
    )
