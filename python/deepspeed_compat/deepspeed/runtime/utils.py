"""`deepspeed.runtime.utils`: helpers scripts import from DeepSpeed's runtime."""

from __future__ import annotations

from typing import Any

import torch


def move_to_device(item: Any, device, criterion_func=None) -> Any:
    """`item` with every tensor inside dicts, lists and tuples moved to `device` (only those
    for which `criterion_func(tensor)` is true, when given)."""
    if torch.is_tensor(item):
        if criterion_func is None or criterion_func(item):
            return item.to(device)
        return item
    if isinstance(item, dict):
        return type(item)((k, move_to_device(v, device, criterion_func)) for k, v in item.items())
    if isinstance(item, (list, tuple)):
        moved = [move_to_device(v, device, criterion_func) for v in item]
        return type(item)(*moved) if hasattr(item, "_fields") else type(item)(moved)
    return item
