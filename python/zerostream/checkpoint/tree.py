"""One walk over the nested containers a checkpoint holds (dicts, lists, tuples, named
tuples such as torch's optimizer state): each leaf that `is_leaf` picks is replaced by
`fn(leaf)`, the containers rebuilt with their own types. torch.Size is a tuple, but a
shape: kept whole."""

from __future__ import annotations

from typing import Any, Callable

import torch


def map_leaves(
    obj: Any, fn: Callable[[Any], Any], is_leaf: Callable[[Any], bool] = torch.is_tensor
) -> Any:
    if is_leaf(obj):
        return fn(obj)
    if isinstance(obj, dict):
        return type(obj)((k, map_leaves(v, fn, is_leaf)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)) and not isinstance(obj, torch.Size):
        items = [map_leaves(v, fn, is_leaf) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    return obj
