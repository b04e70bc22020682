"""What stage 3 keeps per module, in one registry.

Note [Stage-3 module state]
  Every module stage 3 touches has one ModuleState in `_STATES`, a weak mapping from the
  module (FSDP2 keeps its per-module state the same way): its external parameters, the
  hook handles of zero.Init and of the engine, the `_parameters` dict it had before the
  hooks replaced it, and on the root module the engine prepared, that run's Stage3Runtime.
  Nothing is stored in the module's `__dict__` under private names, so a module's state is
  found, and dropped, in one place. The mapping is weak: a module that is garbage has no
  state left behind.
"""

from __future__ import annotations

import weakref
from typing import Any, Dict, List, Optional

import torch


class ModuleState:
    """Stage 3's state of one module (Note [Stage-3 module state])."""

    __slots__ = ("external", "init_hooks", "original_params", "runtime", "__weakref__")

    def __init__(self) -> None:
        # Params another module owns that this one's forward uses, by id (DeepSpeed's
        # register_external_parameter; found by the coordinator on first use).
        self.external: Dict[int, torch.nn.Parameter] = {}
        self.init_hooks: List = []  # zero.Init's gather hooks, removed when an engine takes over
        # The `_parameters` dict hooks.install replaced with one that watches reads.
        self.original_params: Optional[dict] = None
        self.runtime: Any = None  # on the engine's root module: its optimizer.Stage3Runtime


_STATES: "weakref.WeakKeyDictionary[torch.nn.Module, ModuleState]" = weakref.WeakKeyDictionary()


def state_of(module: torch.nn.Module) -> Optional[ModuleState]:
    """The module's stage-3 state, or None when stage 3 never touched it."""
    return _STATES.get(module)


def ensure_state(module: torch.nn.Module) -> ModuleState:
    """The module's stage-3 state, made empty the first time."""
    state = _STATES.get(module)
    if state is None:
        state = _STATES[module] = ModuleState()
    return state


def external_params(module: torch.nn.Module) -> List[torch.nn.Parameter]:
    state = _STATES.get(module)
    return list(state.external.values()) if state is not None else []


def runtime_of(module: torch.nn.Module):
    """The Stage3Runtime an engine built over `module` (its root), or None."""
    state = _STATES.get(module)
    return state.runtime if state is not None else None


def register_external_parameter(module: torch.nn.Module, parameter: torch.nn.Parameter) -> None:
    """Declares that `module`'s forward uses `parameter` owned elsewhere (DeepSpeed's
    zero.register_external_parameter): stage 3 gathers it with the module."""
    if not isinstance(parameter, torch.nn.Parameter):
        raise RuntimeError("register_external_parameter: parameter must be a torch.nn.Parameter")
    ensure_state(module).external[id(parameter)] = parameter


def unregister_external_parameter(module: torch.nn.Module, parameter: torch.nn.Parameter) -> None:
    if not isinstance(parameter, torch.nn.Parameter):
        raise RuntimeError("unregister_external_parameter: parameter must be a torch.nn.Parameter")
    state = _STATES.get(module)
    if state is not None:
        state.external.pop(id(parameter), None)
