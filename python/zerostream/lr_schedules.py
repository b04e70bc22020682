"""DeepSpeed's learning-rate schedules: WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle,
LRRangeTest, plus the `scheduler` section's name lookup (`build_scheduler`).

Constructor parameters, defaults, formulas and checkpoint state (`{'last_batch_iteration': n}`)
match DeepSpeed's `runtime/lr_schedules.py` so that a user's ds_config.json and a resumed
DeepSpeed checkpoint give the same learning rates step for step. Every schedule is a pure
function of `last_batch_iteration`; `step()` advances it and writes the result into the
torch optimizer's `param_groups`.

Note [Schedule quirks kept for parity]
  DeepSpeed's observable behaviour is kept even where another choice would read better,
  because users compare loss curves across the two runtimes:
  * WarmupLR with `warmup_max_lr=None` warms each group up to its own lr. (DeepSpeed used
    group 0's lr for every group until it fixed that; its tests at edaa722 check each
    group's own, test_warmup_lr_inherits_per_group_lr_when_max_unspecified.)
  * WarmupCosineLR writes lr 0.0 into every group at construction (iteration -1).
  * OneCycle cycles `betas[0]` only when the optimizer's defaults have `betas`, and writes
    `(beta1, 0.99)`: beta2 is pinned to 0.99, as DeepSpeed does. Before the first step()
    beta1 is cycle_min_mom (DeepSpeed's constructor writes it), not the cycle's value.
  * `warmup_num_steps` is clamped to at least 2, so that ln(N) in log warmup is not 0.
"""

from __future__ import annotations

import inspect
import logging
import math
import numbers
from typing import Any, List, Mapping, Optional, Sequence

import torch
from torch.optim import Optimizer

logger = logging.getLogger("zerostream")

LR_RANGE_TEST = "LRRangeTest"
ONE_CYCLE = "OneCycle"
WARMUP_LR = "WarmupLR"
WARMUP_DECAY_LR = "WarmupDecayLR"
WARMUP_COSINE_LR = "WarmupCosineLR"
VALID_LR_SCHEDULES = [LR_RANGE_TEST, ONE_CYCLE, WARMUP_LR, WARMUP_DECAY_LR, WARMUP_COSINE_LR]

WARMUP_LOG_RATE = "log"
WARMUP_LINEAR_RATE = "linear"

# OneCycle pins beta2 here; see Note [Schedule quirks kept for parity].
_ONE_CYCLE_BETA2 = 0.99


# --- argument checks ---------------------------------------------------------------------------


def get_torch_optimizer(optimizer: Any) -> Optimizer:
    """The torch optimizer whose param_groups a schedule edits: the argument itself, or the
    `.optimizer` of a wrapper (ZeRO/fp16 optimizers are not Optimizer subclasses)."""
    if isinstance(optimizer, Optimizer):
        return optimizer
    inner = getattr(optimizer, "optimizer", None)
    if isinstance(inner, Optimizer):
        return inner
    raise TypeError(
        f"{type(optimizer).__name__} is not a subclass of torch.optim.Optimizer "
        f"and has no .optimizer that is one"
    )


def _number(value: Any, name: str) -> float:
    # bool is an int subclass; "auto" and other strings are not resolved for schedules.
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name}: expected a finite number; got {value!r}")
    return float(value)


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}: expected a positive integer; got {value!r}")
    return value


def _step_count(value: Any, name: str) -> int:
    """A positive step count that may arrive from JSON as an integral float (1e5)."""
    if value is None:
        raise ValueError(f"{name}: required")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return _positive_int(value, name)


def _non_negative_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}: expected an integer >= 0; got {value!r}")
    return value


def _per_group(value: Any, num_groups: int, name: str) -> List[float]:
    """A scalar broadcast to every param group, or a list/tuple with one value per group."""
    if isinstance(value, (list, tuple)):
        if len(value) != num_groups:
            raise ValueError(
                f"{name}: expected {num_groups} values (one per param group); got {len(value)}"
            )
        return [_number(v, f"{name}[{i}]") for i, v in enumerate(value)]
    return [_number(value, name)] * num_groups


def _warmup_type(value: Any) -> str:
    if value in (WARMUP_LOG_RATE, WARMUP_LINEAR_RATE):
        return value
    # DeepSpeed falls back rather than failing; keep that, but say so.
    logger.warning("warmup_type: unknown value %r; using %r", value, WARMUP_LOG_RATE)
    return WARMUP_LOG_RATE


def _warmup_fraction(iteration: int, num_steps: int, warmup_type: str) -> float:
    """Progress of warmup in [0, 1) for 0 <= iteration < num_steps."""
    if warmup_type == WARMUP_LOG_RATE:
        return math.log(iteration + 1) / math.log(num_steps)
    return iteration / num_steps


def _group_lr(group: Mapping[str, Any]) -> float:
    lr = group["lr"]
    return float(lr.item()) if torch.is_tensor(lr) else float(lr)


def _write_lrs(param_groups: Sequence[dict], lrs: Sequence[float]) -> List[Any]:
    for group, lr in zip(param_groups, lrs):
        if torch.is_tensor(group["lr"]):
            # A tensor lr (capturable/compiled optimizers) must keep its identity and device.
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr
    return [group["lr"] for group in param_groups]


# --- the shared stepping protocol --------------------------------------------------------------


class _Schedule:
    """Iteration bookkeeping shared by all schedules; subclasses define `get_lr()`."""

    def __init__(self, optimizer: Any, last_batch_iteration: int):
        self.optimizer = get_torch_optimizer(optimizer)
        if isinstance(last_batch_iteration, bool) or not isinstance(last_batch_iteration, int):
            raise ValueError(
                f"last_batch_iteration: expected an integer; got {last_batch_iteration!r}"
            )
        self.last_batch_iteration = last_batch_iteration
        self._last_lr: Optional[List[Any]] = None

    def _start(self) -> None:
        # A fresh run writes the iteration -1 lrs now; a resumed one (last_batch_iteration
        # given) leaves the optimizer alone until the first step(), as DeepSpeed does.
        if self.last_batch_iteration == -1:
            self._apply()

    def _apply(self) -> None:
        self._last_lr = _write_lrs(self.optimizer.param_groups, self.get_lr())

    def get_lr(self) -> List[float]:
        raise NotImplementedError

    def get_last_lr(self) -> List[Any]:
        if self._last_lr is None:
            raise RuntimeError(f"{type(self).__name__}.get_last_lr(): call step() first")
        return self._last_lr

    def step(
        self, last_batch_iteration: Optional[int] = None, batch_iteration: Optional[int] = None
    ) -> None:
        # DeepSpeed names the argument `batch_iteration` in OneCycle/LRRangeTest and
        # `last_batch_iteration` in the warmup schedules; lr_kwargs may use either.
        if last_batch_iteration is not None and batch_iteration is not None:
            raise ValueError("step(): give last_batch_iteration or batch_iteration, not both")
        target = last_batch_iteration if last_batch_iteration is not None else batch_iteration
        self.last_batch_iteration = self.last_batch_iteration + 1 if target is None else target
        self._apply()

    def state_dict(self) -> dict:
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        if "last_batch_iteration" not in sd:
            raise ValueError(
                f"{type(self).__name__}.load_state_dict: missing "
                f"'last_batch_iteration'; got keys {sorted(sd)}"
            )
        self.last_batch_iteration = int(sd["last_batch_iteration"])
        # The optimizer's own state_dict restores param_groups' lr; only the report is
        # refreshed here so get_last_lr() does not return the pre-resume value.
        self._last_lr = self.get_lr()


# --- warmup family -----------------------------------------------------------------------------


class WarmupLR(_Schedule):
    """lr = min + (max - min) * gamma; gamma goes 0 -> 1 over warmup_num_steps, then stays 1."""

    def __init__(
        self,
        optimizer: Any,
        warmup_min_lr: Any = 0.0,
        warmup_max_lr: Any = None,
        warmup_num_steps: int = 1000,
        warmup_type: str = WARMUP_LOG_RATE,
        last_batch_iteration: int = -1,
    ):
        num_steps = _positive_int(warmup_num_steps, "warmup_num_steps")
        super().__init__(optimizer, last_batch_iteration)
        groups = self.optimizer.param_groups
        if warmup_max_lr is None:
            # See Note [Schedule quirks kept for parity]: each group's own lr.
            warmup_max_lr = [_group_lr(g) for g in groups]
        self.min_lrs = _per_group(warmup_min_lr, len(groups), "warmup_min_lr")
        self.max_lrs = _per_group(warmup_max_lr, len(groups), "warmup_max_lr")
        self.delta_lrs = [hi - lo for hi, lo in zip(self.max_lrs, self.min_lrs)]
        self.warmup_num_steps = max(2, num_steps)
        self.warmup_type = _warmup_type(warmup_type)
        self._start()

    def _gamma(self) -> float:
        if self.last_batch_iteration < self.warmup_num_steps:
            return _warmup_fraction(
                self.last_batch_iteration, self.warmup_num_steps, self.warmup_type
            )
        return 1.0

    def get_lr(self) -> List[float]:
        if self.last_batch_iteration < 0:
            return list(self.min_lrs)
        gamma = self._gamma()
        return [lo + delta * gamma for lo, delta in zip(self.min_lrs, self.delta_lrs)]


class WarmupDecayLR(WarmupLR):
    """WarmupLR, then a linear decay to 0 at total_num_steps."""

    def __init__(
        self,
        optimizer: Any,
        total_num_steps: Optional[int] = None,
        warmup_min_lr: Any = 0.0,
        warmup_max_lr: Any = 0.001,
        warmup_num_steps: int = 1000,
        warmup_type: str = WARMUP_LOG_RATE,
        last_batch_iteration: int = -1,
    ):
        # Set before super().__init__, which already evaluates get_lr() at iteration -1.
        self.total_num_steps = _step_count(total_num_steps, "total_num_steps")
        super().__init__(
            optimizer,
            warmup_min_lr,
            warmup_max_lr,
            warmup_num_steps,
            warmup_type,
            last_batch_iteration,
        )
        if self.total_num_steps < self.warmup_num_steps:
            logger.warning(
                "total_num_steps %d is less than warmup_num_steps %d",
                self.total_num_steps,
                self.warmup_num_steps,
            )

    def _gamma(self) -> float:
        if self.last_batch_iteration < self.warmup_num_steps:
            return super()._gamma()
        remaining = self.total_num_steps - self.last_batch_iteration
        return max(0.0, remaining / max(1.0, self.total_num_steps - self.warmup_num_steps))


class WarmupCosineLR(_Schedule):
    """Scales each group's initial lr by a ratio: warmup from warmup_min_ratio to 1, then a
    cosine from 1 down to cos_min_ratio at total_num_steps (held there afterwards)."""

    def __init__(
        self,
        optimizer: Any,
        total_num_steps: Optional[int] = None,
        warmup_min_ratio: float = 0.0,
        warmup_num_steps: int = 1000,
        cos_min_ratio: float = 0.0001,
        warmup_type: str = WARMUP_LOG_RATE,
        last_batch_iteration: int = -1,
    ):
        num_steps = _positive_int(warmup_num_steps, "warmup_num_steps")
        super().__init__(optimizer, last_batch_iteration)
        self.total_num_steps = _step_count(total_num_steps, "total_num_steps")
        self.warmup_min_ratio = _number(warmup_min_ratio, "warmup_min_ratio")
        self.cos_min_ratio = _number(cos_min_ratio, "cos_min_ratio")
        self.warmup_num_steps = max(2, num_steps)
        self.warmup_type = _warmup_type(warmup_type)
        if self.total_num_steps < self.warmup_num_steps:
            logger.warning(
                "total_num_steps %d is less than warmup_num_steps %d",
                self.total_num_steps,
                self.warmup_num_steps,
            )
        self.org_lrs = [_group_lr(group) for group in self.optimizer.param_groups]
        self._start()

    def get_lr_ratio(self) -> float:
        it = self.last_batch_iteration
        if it < 0:
            return 0.0
        if it < self.warmup_num_steps:
            frac = _warmup_fraction(it, self.warmup_num_steps, self.warmup_type)
            return self.warmup_min_ratio + frac * (1.0 - self.warmup_min_ratio)
        # Clamped so steps past total_num_steps stay at the floor instead of rising again.
        progress = min(
            1.0,
            (it - self.warmup_num_steps + 1) / max(1, self.total_num_steps - self.warmup_num_steps),
        )
        cosine = (1.0 + math.cos(math.pi * progress)) / 2.0
        return max(0.0, self.cos_min_ratio + (1.0 - self.cos_min_ratio) * cosine)

    def get_lr(self) -> List[float]:
        ratio = self.get_lr_ratio()
        return [lr * ratio for lr in self.org_lrs]


# --- cyclic schedules --------------------------------------------------------------------------


class LRRangeTest(_Schedule):
    """lr = min_lr * (1 + rate * (it + 1) / step_size), the fraction floored in staircase mode."""

    def __init__(
        self,
        optimizer: Any,
        lr_range_test_min_lr: Any = 1e-3,
        lr_range_test_step_size: int = 2000,
        lr_range_test_step_rate: float = 1.0,
        lr_range_test_staircase: bool = False,
        last_batch_iteration: int = -1,
    ):
        super().__init__(optimizer, last_batch_iteration)
        self.min_lr = _per_group(
            lr_range_test_min_lr, len(self.optimizer.param_groups), "lr_range_test_min_lr"
        )
        self.step_size = _positive_int(lr_range_test_step_size, "lr_range_test_step_size")
        self.step_rate = _number(lr_range_test_step_rate, "lr_range_test_step_rate")
        self.staircase = bool(lr_range_test_staircase)
        self._start()

    def _interval(self) -> float:
        fraction = (self.last_batch_iteration + 1) / self.step_size
        return float(math.floor(fraction)) if self.staircase else fraction

    def get_lr(self) -> List[float]:
        increase = 1.0 + self.step_rate * self._interval()
        return [lr * increase for lr in self.min_lr]


class OneCycle(_Schedule):
    """One triangular cycle of lr (min -> max -> min) and, inversely, of beta1, over
    first + second step sizes; then lr decays as min / (1 + rate * k) and beta1 grows as
    max_mom * (1 + mom_rate * k), with k = steps past the cycle / decay_step_size."""

    def __init__(
        self,
        optimizer: Any,
        cycle_min_lr: Any = None,
        cycle_max_lr: Any = None,
        decay_lr_rate: float = 0.0,
        cycle_first_step_size: int = 2000,
        cycle_second_step_size: Optional[int] = None,
        cycle_first_stair_count: int = 0,
        cycle_second_stair_count: Optional[int] = None,
        decay_step_size: int = 0,
        cycle_momentum: bool = True,
        cycle_min_mom: Any = 0.8,
        cycle_max_mom: Any = 0.9,
        decay_mom_rate: float = 0.0,
        last_batch_iteration: int = -1,
    ):
        super().__init__(optimizer, last_batch_iteration)
        self._init_cycle(
            cycle_first_step_size,
            cycle_second_step_size,
            cycle_first_stair_count,
            cycle_second_stair_count,
            decay_step_size,
        )
        num_groups = len(self.optimizer.param_groups)
        for name, value in (("cycle_min_lr", cycle_min_lr), ("cycle_max_lr", cycle_max_lr)):
            if value is None:
                raise ValueError(f"{name}: required")
        self.min_lrs = _per_group(cycle_min_lr, num_groups, "cycle_min_lr")
        self.max_lrs = _per_group(cycle_max_lr, num_groups, "cycle_max_lr")
        self.decay_lr_rate = _number(decay_lr_rate, "decay_lr_rate")
        self.min_moms = _per_group(cycle_min_mom, num_groups, "cycle_min_mom")
        self.max_moms = _per_group(cycle_max_mom, num_groups, "cycle_max_mom")
        self.decay_mom_rate = _number(decay_mom_rate, "decay_mom_rate")
        self.cycle_momentum = bool(cycle_momentum)
        if self.cycle_momentum and "betas" not in self.optimizer.defaults:
            logger.warning(
                "OneCycle: cycle_momentum is disabled because %s has no 'betas'",
                type(self.optimizer).__name__,
            )
            self.cycle_momentum = False
        # Decay happens only when both an interval and a rate are set.
        no_interval = self.decay_step_size == 0
        self.skip_lr_decay = no_interval or self.decay_lr_rate == 0.0
        self.skip_mom_decay = no_interval or self.decay_mom_rate == 0.0
        self._start()

    def _init_cycle(
        self, first: Any, second: Any, first_stairs: Any, second_stairs: Any, decay_step_size: Any
    ) -> None:
        self.first_step_size = float(_positive_int(first, "cycle_first_step_size"))
        self.second_step_size = (
            self.first_step_size
            if second is None
            # 0 is allowed, as in DeepSpeed: no decreasing half (step_ratio 1.0, and x stays
            # below 1.0 in the scale, so nothing divides by zero).
            else float(_non_negative_int(second, "cycle_second_step_size"))
        )
        self.total_size = self.first_step_size + self.second_step_size
        self.step_ratio = self.first_step_size / self.total_size
        self.first_stair_count = _non_negative_int(first_stairs, "cycle_first_stair_count")
        self.second_stair_count = (
            self.first_stair_count
            if second_stairs is None
            else _non_negative_int(second_stairs, "cycle_second_stair_count")
        )
        self.decay_step_size = _non_negative_int(decay_step_size, "decay_step_size")

    def _scale_factor(self) -> float:
        """Height within the cycle in [0, 1]: rises over the first half, falls over the second."""
        it = self.last_batch_iteration + 1
        x = it / self.total_size - math.floor(it / self.total_size)
        if x <= self.step_ratio:
            scale, stairs = x / self.step_ratio, self.first_stair_count
        else:
            scale, stairs = (x - 1.0) / (self.step_ratio - 1.0), self.second_stair_count
        if stairs > 0:
            # Quantise from the integer offset in the cycle, not from `scale`: the float scale
            # at a half-cycle boundary can sit 1e-16 under a stair and floor one stair low.
            pos = it % self.total_size
            if pos <= self.first_step_size:
                position = pos * stairs / self.first_step_size
            else:
                position = (self.total_size - pos) * stairs / self.second_step_size
            scale = math.floor(position) / stairs
        return scale

    def _decay_interval(self) -> float:
        return (self.last_batch_iteration - self.total_size + 1) / self.decay_step_size

    def get_lr(self) -> List[float]:
        if self.last_batch_iteration < self.total_size:
            scale = self._scale_factor()
            return [lo + (hi - lo) * scale for lo, hi in zip(self.min_lrs, self.max_lrs)]
        if self.skip_lr_decay:
            return list(self.min_lrs)
        factor = 1.0 + self.decay_lr_rate * self._decay_interval()
        return [lo / factor for lo in self.min_lrs]

    def get_mom(self) -> Optional[List[tuple]]:
        if not self.cycle_momentum:
            return None
        if self.last_batch_iteration < self.total_size:
            scale = self._scale_factor()
            beta1 = [hi - (hi - lo) * scale for lo, hi in zip(self.min_moms, self.max_moms)]
        elif self.skip_mom_decay:
            beta1 = list(self.max_moms)
        else:
            factor = 1.0 + self.decay_mom_rate * self._decay_interval()
            beta1 = [hi * factor for hi in self.max_moms]
        return [(b, _ONE_CYCLE_BETA2) for b in beta1]

    def _start(self) -> None:
        super()._start()
        # See Note [Schedule quirks kept for parity]: a fresh run starts at cycle_min_mom,
        # although the cycle formula at iteration -1 would give cycle_max_mom.
        if self.last_batch_iteration == -1 and self.cycle_momentum:
            for group, beta1 in zip(self.optimizer.param_groups, self.min_moms):
                group["betas"] = (beta1, _ONE_CYCLE_BETA2)

    def _apply(self) -> None:
        super()._apply()
        moms = self.get_mom()
        if moms is not None:
            for group, betas in zip(self.optimizer.param_groups, moms):
                group["betas"] = betas


# --- the ds_config `scheduler` section ---------------------------------------------------------

_SCHEDULES = {
    cls.__name__: cls for cls in (LRRangeTest, OneCycle, WarmupLR, WarmupDecayLR, WarmupCosineLR)
}


def _torch_scheduler_names() -> List[str]:
    module = torch.optim.lr_scheduler
    base = module.LRScheduler
    return sorted(
        name
        for name, obj in vars(module).items()
        if inspect.isclass(obj)
        and issubclass(obj, base)
        and obj is not base
        and not name.startswith("_")
    )


def _check_params(name: str, cls: type, params: Mapping[str, Any]) -> None:
    """Unknown or missing keys become a ValueError naming them, not a TypeError from **params."""
    sig = inspect.signature(cls.__init__)
    accepted = [
        p
        for p in list(sig.parameters.values())[2:]  # skip self, optimizer
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        return
    names = [p.name for p in accepted]
    unknown = sorted(set(params) - set(names))
    if unknown:
        raise ValueError(
            f"scheduler.params: unknown key(s) {unknown} for {name}; expected some of {names}"
        )
    missing = [p.name for p in accepted if p.default is p.empty and p.name not in params]
    if missing:
        raise ValueError(f"scheduler.params: {name} requires {missing}")


def build_scheduler(name: str, optimizer: Any, params: Optional[Mapping[str, Any]]) -> Any:
    """Builds `scheduler.type` with `scheduler.params`: a DeepSpeed schedule by exact name,
    else a `torch.optim.lr_scheduler` class by exact name (given the unwrapped torch
    optimizer, since torch's schedulers reject wrappers)."""
    if params is None:
        raise ValueError(f"scheduler.params: required for {name!r} (use {{}} for the defaults)")
    if not isinstance(params, Mapping):
        raise ValueError(f"scheduler.params: expected an object; got {type(params).__name__}")
    if name in _SCHEDULES:
        cls = _SCHEDULES[name]
        _check_params(name, cls, params)
        return cls(optimizer, **params)
    torch_names = _torch_scheduler_names()
    if name in torch_names:
        cls = getattr(torch.optim.lr_scheduler, name)
        _check_params(name, cls, params)
        return cls(get_torch_optimizer(optimizer), **params)
    raise ValueError(
        f"scheduler.type: expected one of {VALID_LR_SCHEDULES} or a "
        f"torch.optim.lr_scheduler class {torch_names}; got {name!r}"
    )
