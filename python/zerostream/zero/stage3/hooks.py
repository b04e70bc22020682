"""Module hooks of stage 3: thin functions that call one named coordinator method each
(coordinator.py). Forward pre/post hooks gather and release around a module's forward; a
hook on the gradient of the module's outputs gathers its params before its backward runs."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Iterator, List

import torch

from .coordinator import ParamCoordinator, module_params


def _pre_forward(coord: ParamCoordinator, module: torch.nn.Module, args) -> None:
    coord.pre_forward(module)


def _post_forward(coord: ParamCoordinator, module: torch.nn.Module, args, output) -> None:
    coord.post_forward(module)
    if torch.is_grad_enabled() and module_params(module):
        once = _OncePerForward(coord, module)
        for t in _tensors(output):
            if t.requires_grad:
                t.register_hook(once)


class _OncePerForward:
    """Calls coord.pre_backward(module) for the first output gradient of one forward call."""

    __slots__ = ("coord", "module", "fired")

    def __init__(self, coord: ParamCoordinator, module: torch.nn.Module):
        self.coord, self.module, self.fired = coord, module, False

    def __call__(self, grad):
        if not self.fired:
            self.fired = True
            self.coord.pre_backward(self.module)
        return None


def _tensors(value) -> Iterator[torch.Tensor]:
    """The tensors in a module's output (nested tuples, lists, dicts, HF ModelOutputs)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _tensors(v)


def install(modules, coord: ParamCoordinator) -> List:
    """Hooks every module in `modules` to `coord`; returns the handles (removed by
    `remove`). Counts, for each param, the modules that use it (tied weights: two)."""
    handles = []
    for m in modules:
        for zp in module_params(m):
            zp.modules += 1
        handles.append(m.register_forward_pre_hook(functools.partial(_pre_forward, coord)))
        handles.append(m.register_forward_hook(functools.partial(_post_forward, coord)))
    return handles


def remove(modules, handles: List) -> None:
    for h in handles:
        h.remove()
    for m in modules:
        for zp in module_params(m):
            zp.modules = 0
