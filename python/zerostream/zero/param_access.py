"""DeepSpeed's parameter-level accessors (`deepspeed.utils.safe_get_full_fp32_param` and
friends): one parameter's fp32 master weights, optimizer state and gradient, read from or
written to wherever its ZeRO optimizer keeps them (the device, the host arena, the NVMe swap
store), whatever the stage.

Note [Param access semantics] (DeepSpeed 0.19's deepspeed/utils/tensor_fragment.py)
  * `safe_get_full_*` are collectives at stages 1-3: every rank of the data-parallel group
    calls them for the same parameter. Each rank contributes the fragment it holds and the
    full tensor is summed over ranks (fragments are disjoint). They return fp32 tensors of
    the parameter's shape on its device, or None for a parameter no ZeRO optimizer steps
    (frozen, or not given to initialize), as DeepSpeed does.
  * Setters write this rank's fragment of the optimizer's fp32 state and need no
    collective. The model's 16-bit weights take a new fp32 value at the next applied
    optimizer step, which rewrites them from the masters, as in DeepSpeed (at stage 0 with
    fp32 weights the master is the weight itself).
  * Optimizer state ("exp_avg", "exp_avg_sq", ...) exists once the optimizer has stepped;
    asking for a key it does not hold is a ValueError on every rank.
  * Gradients are held between backward and the step (ZeroOptimizerBase.holding_grads):
    the full gradient is then the average over ranks of what was accumulated so far, as
    the step will use it (still multiplied by the fp16 loss scale); before the first
    backward and after the step, `safe_get_full_grad` returns None. Inside
    engine.coalesce_grad_reduction() at stages 2 and 3, where a gradient waits on
    param.grad unreduced, it returns that (this rank's own), as DeepSpeed does.
  * `safe_*_local_*` are ZeRO-3 only (a ValueError elsewhere): this rank's padded shard
    of the parameter, `ceil(numel / world)` elements, in fp32.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch.utils.weak import WeakIdKeyDictionary

from .. import comm
from .stage3.param import zero_param_of

_OWNERS = WeakIdKeyDictionary()  # parameter -> weakref to the ZeRO optimizer stepping it


@dataclass(frozen=True)
class Fragment:
    """The part of one parameter this rank holds fp32 state for: its flattened elements
    [lo, hi) are elements [offset, offset + hi - lo) of fp32 state tensor `index` (a param
    group's partition at stages 1-3, the parameter's own master at stage 0)."""

    index: int
    offset: int
    lo: int
    hi: int


class _Access:
    """Where one ZeRO optimizer keeps a parameter's fp32 state and gradient. Subclasses
    describe a stage's layout; reading and writing state is shared."""

    replicated = False  # every rank holds every parameter's state (stage 0)

    def __init__(self, opt):
        self.opt = opt
        self.world = opt.ctx.world
        # The step's average over ranks (1 with gradient_allreduce_op "sum").
        self.divisor = opt.dp_divisor
        self.group = opt.ctx.group
        self.device = opt.ctx.device

    def shape(self, param) -> torch.Size:
        return param.shape

    def fragment(self, param) -> Fragment:
        raise NotImplementedError

    def master(self, index: int) -> torch.Tensor:
        """The fp32 tensor the inner optimizer steps (its state is keyed by it)."""
        return self.opt.masters[index]

    def grad_view(self, param) -> Optional[Tuple[int, torch.Tensor, bool]]:
        """(lo, values, summed): this rank's gradient elements [lo, lo + len) of the param,
        either the sum over ranks of the elements it owns (`summed`), or its own local
        gradient, which the step will sum over ranks. None: the param has no gradient."""
        raise NotImplementedError

    def grad_assign(self, param, target: torch.Tensor, values: torch.Tensor) -> None:
        """Writes `values` where grad_view's `target` came from."""
        target.copy_(values)

    # --- the fp32 state ---------------------------------------------------------------------
    def _swapper(self):
        return getattr(self.opt, "swapper", None)

    def keys(self, index: int) -> list:
        """Optimizer state kinds held for state tensor `index`: tensors shaped like it."""
        swapper = self._swapper()
        if swapper is not None:
            return ["exp_avg", "exp_avg_sq"] if swapper.steps[index] > 0 else []
        master = self.master(index)
        state = self.opt.optimizer.state.get(master, {})
        return [k for k, v in state.items() if torch.is_tensor(v) and v.shape == master.shape]

    def check_kind(self, index: int, kind: str, what: str) -> None:
        if kind == "param" or kind in self.keys(index):
            return
        held = self.keys(index)
        raise ValueError(
            f"{what}: optimizer state {kind!r} not found for this parameter; "
            + (
                f"the optimizer holds {held}"
                if held
                else "the optimizer holds none yet (it is made by the first optimizer step)"
            )
        )

    def _tensor(self, index: int, kind: str) -> torch.Tensor:
        master = self.master(index)
        if kind == "param":
            return master.detach()
        return self.opt.optimizer.state[master][kind]

    def read(self, index: int, offset: int, n: int, kind: str) -> torch.Tensor:
        swapper = self._swapper()
        if swapper is not None:
            return swapper.state_access.read_range(index, offset, offset + n, kind)
        return self._tensor(index, kind).reshape(-1)[offset : offset + n]

    def write(self, index: int, offset: int, values: torch.Tensor, kind: str) -> None:
        stage = getattr(self.opt, "copy_stage", None)
        if stage is not None:
            # The last update's uploads may still read what this rewrites (host masters in
            # the model's dtype are their own upload source), as the next update drains.
            stage.drain()
        swapper = self._swapper()
        values = values.detach().reshape(-1)
        if swapper is not None:
            swapper.state_access.write_state(index, offset, values.to("cpu", torch.float32), kind)
            return
        target = self._tensor(index, kind).reshape(-1)[offset : offset + values.numel()]
        with torch.no_grad():
            target.copy_(values)

    def local_span(self, param) -> Tuple[int, int, int]:
        """(index, offset, numel) of this rank's padded shard (ZeRO-3 only)."""
        raise ValueError(
            "only defined for ZeRO-3 partitioned parameters (as in DeepSpeed); this run is "
            f"ZeRO stage {self.opt.ctx.config.zero_stage}"
        )


class _Replicated(_Access):
    """Stage 0: every rank holds every parameter; masters (fp16/bf16 runs) or the fp32
    parameters themselves are what the inner optimizer steps."""

    replicated = True

    def __init__(self, opt):
        super().__init__(opt)
        self.index = {id(p): i for i, p in enumerate(opt.params)}

    def fragment(self, param) -> Fragment:
        return Fragment(self.index[id(param)], 0, 0, param.numel())

    def master(self, index: int) -> torch.Tensor:
        masters = self.opt.masters
        return masters[index] if masters is not None else self.opt.params[index]

    def grad_view(self, param):
        return None if param.grad is None else (0, param.grad.reshape(-1), False)


class _Flat(_Access):
    """Stages 1 and 2: each group flattened, rank r owning one contiguous range of it
    (zero/flat.py); stage 1 keeps whole local gradients until the step."""

    def __init__(self, opt):
        super().__init__(opt)
        self.slots = {
            id(s.param): (gi, s) for gi, flat in enumerate(opt.flat_groups) for s in flat.slots
        }

    def fragment(self, param) -> Fragment:
        gi, slot = self.slots[id(param)]
        flat = self.opt.flat_groups[gi]
        start, end = flat.overlap(slot)
        return Fragment(gi, slot.offset + start - flat.partition_begin, start, end)

    def grad_view(self, param):
        gi, slot = self.slots[id(param)]
        if self.opt.stage == 1:
            local = self.opt.reducer.local[gi]
            return 0, local[slot.offset : slot.offset + slot.numel], False
        f = self.fragment(param)
        return f.lo, self.opt.grads[gi][f.offset : f.offset + f.hi - f.lo], True


class _Sharded(_Access):
    """Stage 3: each parameter cut into `world` shards of ceil(numel / world) elements; a
    group's partition is this rank's shards of its parameters, concatenated."""

    def shape(self, param) -> torch.Size:
        return zero_param_of(param).shape

    def fragment(self, param) -> Fragment:
        zp = zero_param_of(param)
        group, at = self.opt.slots[zp.ds_id]
        lo = zp.rank * zp.shard_numel
        return Fragment(group, at, lo, lo + zp.shard_valid)

    def grad_view(self, param):
        f = self.fragment(param)  # a copy where it straddles the device tier's boundary
        return f.lo, self.opt.grad_read(f.index, f.offset, f.hi - f.lo), True

    def grad_assign(self, param, target: torch.Tensor, values: torch.Tensor) -> None:
        f = self.fragment(param)
        self.opt.grad_write(f.index, f.offset, values)

    def local_span(self, param) -> Tuple[int, int, int]:
        zp = zero_param_of(param)
        group, at = self.opt.slots[zp.ds_id]
        return group, at, zp.shard_numel


_ACCESS = {0: _Replicated, 1: _Flat, 2: _Flat, 3: _Sharded}


def register(opt, params) -> None:
    """Makes `params` reachable by the helpers below through `opt`, the ZeRO optimizer that
    steps them (zero/factory.py calls it). The optimizer holds its accessor; this table
    holds neither the parameters nor the optimizer alive."""
    opt.param_access = _ACCESS[opt.ctx.config.zero_stage](opt)
    ref = weakref.ref(opt)
    for p in params:
        _OWNERS[p] = ref


def _access(param) -> Optional[_Access]:
    ref = _OWNERS.get(param) if isinstance(param, torch.Tensor) else None
    opt = ref() if ref is not None else None
    if opt is None:
        return None
    opt.settle_update()  # an update behind the forward (zero/overlap.py) writes this state
    return opt.param_access


# --- full tensors (Note [Param access semantics]) ---------------------------------------------
def _assemble(access: _Access, param, lo: int, values: Optional[torch.Tensor]) -> torch.Tensor:
    """The full parameter-shaped fp32 tensor: this rank's `values` at [lo, ...), summed over
    the ranks (a collective unless stage 0 replicates it)."""
    shape = access.shape(param)
    out = torch.zeros(shape.numel(), dtype=torch.float32, device=access.device)
    if values is not None and values.numel():
        out[lo : lo + values.numel()].copy_(values.reshape(-1))
    if access.world > 1:
        comm.all_reduce(out, group=access.group)
    return out.view(shape).to(param.device)


def _get_full(param, kind: str, what: str) -> Optional[torch.Tensor]:
    access = _access(param)
    if access is None:
        return None
    f = access.fragment(param)
    access.check_kind(f.index, kind, what)
    values = access.read(f.index, f.offset, f.hi - f.lo, kind)
    if access.replicated:
        return values.float().clone().view(access.shape(param)).to(param.device)
    return _assemble(access, param, f.lo, values)


def _check_numel(access: _Access, param, value: torch.Tensor, what: str) -> None:
    numel = access.shape(param).numel()
    if value.numel() != numel:
        raise ValueError(f"{what}: value has {value.numel()} elements; the parameter has {numel}")


def _set_full(param, value: torch.Tensor, kind: str, what: str) -> None:
    access = _access(param)
    if access is None:
        return
    _check_numel(access, param, value, what)
    f = access.fragment(param)
    access.check_kind(f.index, kind, what)
    if f.hi > f.lo:
        access.write(f.index, f.offset, value.reshape(-1)[f.lo : f.hi], kind)


def safe_get_full_fp32_param(param) -> Optional[torch.Tensor]:
    """The parameter's fp32 master weights, whole (a collective at stages 1-3)."""
    return _get_full(param, "param", "safe_get_full_fp32_param")


def safe_set_full_fp32_param(param, value: torch.Tensor) -> None:
    """Sets the fp32 master weights from the whole `value` (each rank keeps its part); the
    model's weights follow at the next optimizer step."""
    _set_full(param, value, "param", "safe_set_full_fp32_param")


def safe_get_full_optimizer_state(param, optim_state_key: str) -> Optional[torch.Tensor]:
    """One optimizer state of the parameter (e.g. "exp_avg"), whole (a collective at stages
    1-3)."""
    return _get_full(param, optim_state_key, "safe_get_full_optimizer_state")


def safe_set_full_optimizer_state(param, value: torch.Tensor, optim_state_key: str) -> None:
    """Sets one optimizer state of the parameter from the whole `value`."""
    _set_full(param, value, optim_state_key, "safe_set_full_optimizer_state")


def safe_get_full_grad(param) -> Optional[torch.Tensor]:
    """The parameter's gradient averaged over ranks, between backward and the step; None
    outside that window (a collective at every stage while gradients are held)."""
    access = _access(param)
    if access is None:
        return param.grad if isinstance(param, torch.Tensor) else None
    held = access.opt.coalesced_grad(param) if access.opt.coalescing else None
    if held is not None:
        return held  # not reduced yet: this rank's own sum, as DeepSpeed answers there
    if not access.opt.holding_grads:
        return None
    view = access.grad_view(param)
    if view is None:
        return None
    lo, values, _ = view
    if access.replicated and access.opt.reduced:
        # Stage 0 after the boundary's backward reduced (Note [Stage 0 reduces at the
        # boundary's backward]): every rank holds the reduced gradient already.
        return values.float().clone().view(access.shape(param)).to(param.device)
    full = _assemble(access, param, lo, values.float())
    return full.div_(access.divisor) if access.divisor > 1 else full


def _require_grads(access: _Access, what: str) -> None:
    if not access.opt.holding_grads:
        raise ValueError(
            f"{what}: no gradients are held now; call it after backward and before the "
            "optimizer step"
        )


def safe_set_full_grad(param, value: torch.Tensor) -> None:
    """Sets the gradient the next step uses (the average over ranks) to the whole `value`,
    between backward and the step."""
    what = "safe_set_full_grad"
    access = _access(param)
    if access is None:
        if isinstance(param, torch.Tensor) and param.grad is not None:
            param.grad.copy_(value)
        return
    _require_grads(access, what)
    _check_numel(access, param, value, what)
    view = access.grad_view(param)
    flat = value.detach().reshape(-1)
    with torch.no_grad():
        if view is None:  # stage 0, no gradient reached the param: it gets this one
            param.grad = flat.to(param.device, param.dtype).view_as(param).clone()
            return
        lo, target, summed = view
        piece = flat[lo : lo + target.numel()].to(target.device, torch.float32)
        # The step divides the sum over ranks by the world size (Note [Param access ...]).
        access.grad_assign(param, target, piece * access.divisor if summed else piece)


def safe_update_full_grad_vectorized(params, update_func) -> None:
    """Replaces each trainable param's whole gradient g by `update_func(g, param)` (DeepSpeed's
    vectorized gradient update: clipping or masking before the step). `g` is what
    safe_get_full_grad returns (fp32, the average over ranks), so return the new gradient in
    that dtype. A collective at stages 1-3, param by param: every rank passes the same list."""
    for p in params:
        if not getattr(p, "requires_grad", False):
            continue
        grad = safe_get_full_grad(p)
        if grad is not None:
            safe_set_full_grad(p, update_func(grad, p))


# --- this rank's shard (ZeRO-3) -----------------------------------------------------------------
def _local(param, what: str) -> Optional[Tuple[_Access, Tuple[int, int, int]]]:
    access = _access(param)
    if access is None:
        if zero_param_of(param) is None:
            raise ValueError(f"{what}: only defined for ZeRO-3 partitioned parameters")
        return None  # partitioned, but no optimizer steps it (frozen)
    try:
        return access, access.local_span(param)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None


def _get_local(param, kind: str, what: str) -> Optional[torch.Tensor]:
    found = _local(param, what)
    if found is None:
        return None
    access, (index, offset, n) = found
    access.check_kind(index, kind, what)
    return access.read(index, offset, n, kind).float().clone().to(param.device)


def _set_local(param, value: torch.Tensor, kind: str, what: str) -> None:
    found = _local(param, what)
    if found is None:
        return
    access, (index, offset, n) = found
    if value.numel() != n:
        raise ValueError(f"{what}: value has {value.numel()} elements; this rank's shard has {n}")
    access.check_kind(index, kind, what)
    access.write(index, offset, value, kind)


def safe_get_local_fp32_param(param) -> Optional[torch.Tensor]:
    """This rank's shard of the fp32 master weights (ZeRO-3)."""
    return _get_local(param, "param", "safe_get_local_fp32_param")


def safe_set_local_fp32_param(param, value: torch.Tensor) -> None:
    _set_local(param, value, "param", "safe_set_local_fp32_param")


def safe_get_local_optimizer_state(param, optim_state_key: str) -> Optional[torch.Tensor]:
    """This rank's shard of one optimizer state (ZeRO-3)."""
    return _get_local(param, optim_state_key, "safe_get_local_optimizer_state")


def safe_set_local_optimizer_state(param, value: torch.Tensor, optim_state_key: str) -> None:
    _set_local(param, value, optim_state_key, "safe_set_local_optimizer_state")


def safe_get_local_grad(param) -> Optional[torch.Tensor]:
    """This rank's shard of the gradient averaged over ranks (ZeRO-3), between backward and
    the step; None outside it."""
    found = _local(param, "safe_get_local_grad")
    if found is None or not found[0].opt.holding_grads:
        return None
    access, (index, offset, n) = found
    local = access.opt.grad_read(index, offset, n).float() / access.divisor
    return local.to(param.device)


def safe_set_local_grad(param, value: torch.Tensor) -> None:
    what = "safe_set_local_grad"
    found = _local(param, what)
    if found is None:
        return
    access, (index, offset, n) = found
    _require_grads(access, what)
    if value.numel() != n:
        raise ValueError(f"{what}: value has {value.numel()} elements; this rank's shard has {n}")
    with torch.no_grad():
        value = value.detach().reshape(-1).to(torch.float32)
        access.opt.grad_write(index, offset, value * access.divisor)


__all__ = [
    "safe_get_full_fp32_param",
    "safe_set_full_fp32_param",
    "safe_get_full_optimizer_state",
    "safe_set_full_optimizer_state",
    "safe_get_full_grad",
    "safe_set_full_grad",
    "safe_update_full_grad_vectorized",
    "safe_get_local_fp32_param",
    "safe_set_local_fp32_param",
    "safe_get_local_optimizer_state",
    "safe_set_local_optimizer_state",
    "safe_get_local_grad",
    "safe_set_local_grad",
]
