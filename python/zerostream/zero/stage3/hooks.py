"""Module hooks of stage 3: thin functions that call one named coordinator method each
(coordinator.py). Forward pre/post hooks gather and release around a module's forward; a
hook on the gradient of the module's outputs gathers its params before its backward runs.
A frozen param (a LoRA base layer's, or a BitFit Linear's weight beside its trained bias)
has no gradient hook to release it in backward: the module's inputs that need a gradient
(positional and keyword) pass through _AfterBackward, whose backward runs once the module's
has produced their gradients, and releases the module's frozen params there instead of at
the end of backward (else backward would end with every frozen weight of the model
gathered); coordinator.post_backward says when that is safe.

A module's `_parameters` dict is replaced by one that notices a partitioned parameter read
while some module's forward runs (`self.tok.weight` used by a parent's output head): the
coordinator gathers it and registers it as an external parameter of the running module, so
later steps gather it with that module (DeepSpeed's ZeROOrderedDict does the same). A
param a module returns as an output (a bias its parent adds) is handed up the same way
(coordinator._hand_up)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Iterator, List

import torch

from .coordinator import ParamCoordinator, module_params
from .leaf import is_leaf
from .module_state import ensure_state, state_of


def _pre_forward(coord: ParamCoordinator, module: torch.nn.Module, args, kwargs):
    coord.pre_forward(module)
    if not torch.is_grad_enabled():
        return None
    leaf = is_leaf(module)
    if leaf:
        coord.leaf_started(module)  # Note [A leaf's gradients reach the reduce in one order]
    if leaf or coord.has_frozen(module):
        return _release_after_backward(coord, module, args, kwargs)
    return None


class _AfterBackward(torch.autograd.Function):
    """Identity on a module's inputs whose backward calls `done` (the module's backward has
    produced the gradients of all of them) and passes the gradients through."""

    @staticmethod
    def forward(ctx, done, *inputs):
        ctx.done = done
        return tuple(t.detach() for t in inputs)

    @staticmethod
    def backward(ctx, *grads):
        ctx.done()
        return (None, *grads)


def _release_after_backward(coord: ParamCoordinator, module: torch.nn.Module, args, kwargs):
    """(args, kwargs) with the tensors that need a gradient passed through _AfterBackward, or
    None (no change) when none does: the frozen params are then released at the end of
    backward."""
    keys = [(None, i) for i, a in enumerate(args) if _needs_grad(a)]
    keys += [(k, None) for k, a in kwargs.items() if _needs_grad(a)]
    if not keys:
        return None
    done = functools.partial(coord.post_backward, module)
    outs = _AfterBackward.apply(done, *(kwargs[k] if k is not None else args[i] for k, i in keys))
    args, kwargs = list(args), dict(kwargs)
    for (k, i), out in zip(keys, outs):
        if k is None:
            args[i] = out
        else:
            kwargs[k] = out
    return tuple(args), kwargs


def _needs_grad(value) -> bool:
    return isinstance(value, torch.Tensor) and value.requires_grad


def _post_forward(coord: ParamCoordinator, module: torch.nn.Module, args, output) -> None:
    returned = [t for t in _tensors(output) if isinstance(t, torch.nn.Parameter)]
    coord.post_forward(module, returned)
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


class _WatchedParams(dict):
    """A module's `_parameters`: reading a partitioned param during a forward fetches it."""

    def __init__(self, params, coord: ParamCoordinator):
        super().__init__(params)
        self.coord = coord

    def __getitem__(self, key):
        p = super().__getitem__(key)
        if p is not None and self.coord.frames:
            self.coord.access(p)
        return p


def install(modules, coord: ParamCoordinator) -> List:
    """Hooks every module in `modules` to `coord`; returns the handles (removed by
    `remove`). Counts, for each param, the modules that use it (tied weights: two)."""
    handles = []
    for m in modules:
        coord.register(m)  # its unit key, the same on every rank (install order)
        for zp in module_params(m):
            zp.modules += 1
        state = ensure_state(m)
        if state.original_params is None:
            state.original_params = m._parameters
        m.__dict__["_parameters"] = _WatchedParams(m._parameters, coord)  # a copy, as it is now
        handles.append(
            m.register_forward_pre_hook(functools.partial(_pre_forward, coord), with_kwargs=True)
        )
        handles.append(m.register_forward_hook(functools.partial(_post_forward, coord)))
    return handles


def remove(modules, handles: List) -> None:
    for h in handles:
        h.remove()
    for m in modules:
        state = state_of(m)
        if state is not None and state.original_params is not None:
            # The watched dict is a copy: params registered since then go back too.
            state.original_params.clear()
            state.original_params.update(dict.items(m._parameters))
            m.__dict__["_parameters"] = state.original_params
            state.original_params = None
        for zp in module_params(m):
            zp.modules = 0
