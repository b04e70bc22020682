"""Exact comparison of tensor collections that cannot pass vacuously: `all(... for k in a)`
says nothing about keys `b` has and `a` lacks, and `zip` stops at the shorter side."""

from typing import Mapping, Sequence, Union

import torch

Tensors = Union[Mapping[str, torch.Tensor], Sequence[torch.Tensor]]


def same_tensors(a: Tensors, b: Tensors) -> bool:
    """True when `a` and `b` hold the same names (or the same number of tensors, in order)
    and every pair is bit-equal, dtype and shape included."""
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        if not (isinstance(a, Mapping) and isinstance(b, Mapping)) or set(a) != set(b):
            return False
        return all(_equal(a[k], b[k]) for k in a)
    return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))


def _equal(x: torch.Tensor, y: torch.Tensor) -> bool:
    return x.dtype == y.dtype and torch.equal(x, y)


def gathered_weights(engine) -> list:
    """The engine's parameters whole (gathered at stage 3), copied, in module order."""
    import zerostream

    params = list(engine.module.parameters())
    with zerostream.zero.GatheredParameters(params):
        return [p.detach().clone() for p in params]
