"""ZeRO-3 leaf modules: a module whose whole subtree is gathered and released as one unit.

Note [Leaf modules]
  Stage 3 gathers each module's own parameters around its forward and backward. A mixture-
  of-experts block runs only the experts its tokens route to, and each rank routes its own
  tokens: per-expert gathers would be collectives that some ranks call and others do not.
  A leaf module is gathered whole at its forward pre-hook (every parameter below it) and
  released whole after its backward; its descendants get no hooks, so what runs inside it
  never issues a collective. DeepSpeed calls these z3 leaf modules and marks them with a
  `_z3_leaf` attribute on the module; zerostream reads and writes the same attribute, so
  `deepspeed.utils.set_z3_leaf_modules` and the config's `zero_optimization.leaf_module`
  mark the same modules. Leaves are read when an engine (or zero.Init's hooks) installs
  its hooks: mark them before `initialize`.

  The config section (DeepSpeed 0.18+): `{"classes": [...], "names": [...],
  "name_suffixes": [...]}`. A class is named by its `__name__` or its fully qualified name;
  a name is a `named_modules()` path; a suffix matches the end of such a path. `classes`
  defaults to the sparse-MoE blocks of Mixtral, Qwen2-MoE and Qwen3-MoE, as DeepSpeed's.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Iterable, Iterator, List, Mapping, Sequence, Tuple, Union

import torch

logger = logging.getLogger("zerostream")

LEAF_ATTR = "_z3_leaf"

DEFAULT_CLASSES: Tuple[str, ...] = (
    "transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock",
    "transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock",
    "transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock",
)


@dataclasses.dataclass(frozen=True)
class LeafModuleConfig:
    """`zero_optimization.leaf_module`, resolved: lists, deduplicated, in the given order."""

    classes: List[str] = dataclasses.field(default_factory=lambda: list(DEFAULT_CLASSES))
    names: List[str] = dataclasses.field(default_factory=list)
    name_suffixes: List[str] = dataclasses.field(default_factory=list)


def leaf_config(raw: Union[Mapping, None]) -> LeafModuleConfig:
    """The section as given (a string stands for a one-item list); unknown keys and
    non-string entries are refused by name."""
    if raw is None:
        return LeafModuleConfig()
    if not isinstance(raw, Mapping):
        raise ValueError(
            f"zero_optimization.leaf_module: expected an object with classes, names and "
            f"name_suffixes; got {type(raw).__name__}"
        )
    fields = [f.name for f in dataclasses.fields(LeafModuleConfig)]
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ValueError(
            f"zero_optimization.leaf_module.{unknown[0]}: unknown key; expected one of {fields}"
        )
    resolved = {}
    for key in fields:
        if key not in raw:
            continue
        value = raw[key]
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not all(isinstance(v, str) for v in items):
            raise ValueError(
                f"zero_optimization.leaf_module.{key}: expected a string or a list of "
                f"strings; got {value!r}"
            )
        resolved[key] = list(dict.fromkeys(items))
    return LeafModuleConfig(**resolved)


def is_leaf(module: torch.nn.Module) -> bool:
    return bool(getattr(module, LEAF_ATTR, False))


def _qualified_name(module: torch.nn.Module) -> str:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


def _matches(module: torch.nn.Module, spec: Union[type, str]) -> bool:
    if isinstance(spec, type):
        return isinstance(module, spec)
    return type(module).__name__ == spec or _qualified_name(module) == spec


def mark_by_class(
    model: torch.nn.Module,
    classes: Sequence[Union[type, str]],
    flag: bool = True,
    raise_if_not_found: bool = True,
) -> List[torch.nn.Module]:
    """Sets (or with flag False clears) the leaf mark of every module that is an instance of
    one of `classes` (types, or class names plain or fully qualified); returns them."""
    bad = [c for c in classes if not isinstance(c, (type, str))]
    if bad:
        raise TypeError(f"leaf module classes must be types or class names; got {bad!r}")
    marked = [m for m in model.modules() if any(_matches(m, c) for c in classes)]
    for m in marked:
        setattr(m, LEAF_ATTR, flag)
    if not marked and raise_if_not_found:
        names = [c if isinstance(c, str) else c.__name__ for c in classes]
        raise ValueError(f"no module of the classes {names} in the model ({type(model).__name__})")
    return marked


def mark_by_name(
    model: torch.nn.Module,
    names: Sequence[str],
    flag: bool = True,
    raise_if_not_found: bool = True,
    suffix: bool = False,
) -> Tuple[List[torch.nn.Module], List[str]]:
    """Marks the modules at the `named_modules()` paths in `names` (with `suffix`, every
    path ending with one of them); returns the modules and the names that matched none."""
    by_name = dict(model.named_modules())
    marked: List[torch.nn.Module] = []
    missing: List[str] = []
    for name in names:
        found = [m for n, m in by_name.items() if (n.endswith(name) if suffix else n == name)]
        if not found:
            missing.append(name)
        for m in found:
            setattr(m, LEAF_ATTR, flag)
            if all(m is not seen for seen in marked):
                marked.append(m)
    if missing and raise_if_not_found:
        what = "module paths ending with" if suffix else "modules named"
        raise ValueError(f"no {what} {missing} in the model ({type(model).__name__})")
    return marked, missing


def apply_config(model: torch.nn.Module, cfg: LeafModuleConfig) -> List[torch.nn.Module]:
    """Marks the modules the section names; a name or suffix given but not found is
    logged, as are sections that matched nothing but differ from the default."""
    marked = mark_by_class(model, cfg.classes, raise_if_not_found=False)
    by_name, missing = mark_by_name(model, cfg.names, raise_if_not_found=False)
    by_suffix, missing_suffixes = mark_by_name(
        model, cfg.name_suffixes, raise_if_not_found=False, suffix=True
    )
    for m in by_name + by_suffix:
        if all(m is not seen for seen in marked):
            marked.append(m)
    if missing:
        logger.warning(f"zero_optimization.leaf_module.names: no module named {missing}")
    if missing_suffixes:
        logger.warning(
            f"zero_optimization.leaf_module.name_suffixes: no module path ends with "
            f"{missing_suffixes}"
        )
    if marked:
        logger.info(f"ZeRO-3 leaf modules: {sorted({type(m).__name__ for m in marked})}")
    return marked


def hooked_modules(root: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """`root`'s modules that stage 3 hooks: all of them but those inside a leaf, each once
    (a module shared by two parents included), in `root.modules()`'s order."""
    seen = set()
    stack = [root]
    while stack:
        module = stack.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        yield module
        if not is_leaf(module):
            stack.extend(reversed(list(module.children())))


class LeafGrads:
    """Note [A leaf's gradients reach the reduce in one order]
    Stage 3 reduce-scatters gradients in buckets filled in the order autograd finishes
    them, which every rank must share. Inside a leaf, each rank runs its own experts: the
    gradients that arrive, and their order, differ between ranks, and the buckets would pair
    one rank's expert 0 with another's expert 1. So a leaf's gradients are held as they
    arrive and handed to the reducer when the leaf's backward is done, all of the leaf's
    trained params in one order (ds_id), a param that got no gradient on this rank as zeros
    (an expert nobody here routed to: its average over ranks is still right). The leaf's
    backward is done when its inputs' gradients exist (hooks.py passes them through
    _AfterBackward); when no input needs a gradient, at the end of backward."""

    def __init__(
        self, leaves: Iterable[torch.nn.Module], module_params, trained: set, add, released
    ):
        """`add(zp, grad)`: the reducer's; `released(zp)`: the coordinator's after_grad (a
        param handed on is not needed again in this backward)."""
        self.add, self.released = add, released
        self.members = {
            id(m): sorted(
                (zp for zp in module_params(m) if zp.ds_id in trained), key=lambda zp: zp.ds_id
            )
            for m in leaves
        }
        self.owned = {zp.ds_id for zps in self.members.values() for zp in zps}
        self.held: dict = {}
        self.pending: dict = {}  # leaf -> its forwards whose backward is not done

    def owns(self, zp) -> bool:
        return zp.ds_id in self.owned

    def hold(self, zp, grad: torch.Tensor) -> None:
        prior = self.held.get(zp.ds_id)
        self.held[zp.ds_id] = grad if prior is None else prior + grad

    def started(self, module: torch.nn.Module) -> None:
        if id(module) in self.members:
            self.pending[id(module)] = self.pending.get(id(module), 0) + 1

    def done(self, module: torch.nn.Module) -> None:
        key = id(module)
        if self.pending.get(key, 0) > 0:
            self.pending[key] -= 1
            self._hand_on(key)

    def finish(self) -> None:
        """End of backward: the leaves whose backward never reported done, in the order of
        their first param's ds_id (the same on every rank)."""
        waiting = [k for k, n in self.pending.items() if n > 0 and self.members[k]]
        for key in sorted(waiting, key=lambda k: self.members[k][0].ds_id):
            self._hand_on(key)
        self.pending.clear()
        self.held.clear()

    def _hand_on(self, key: int) -> None:
        for zp in self.members[key]:
            grad = self.held.pop(zp.ds_id, None)
            if grad is None:
                grad = torch.zeros(zp.shape, dtype=zp.dtype, device=zp.device)
            self.add(zp, grad)
            self.released(zp)
