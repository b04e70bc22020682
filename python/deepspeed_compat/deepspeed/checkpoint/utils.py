"""`deepspeed.checkpoint.utils`."""

from __future__ import annotations

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
