"""The small records the engine hands its collaborators (accessors.py, accumulation.py,
checkpoints.py) instead of itself: the training counters, which the loop advances and a
checkpoint load sets, the ranks of this process, and the optimizer and LR scheduler as the
engine holds them now. A collaborator sees these and nothing else of the engine, so what it
reads and writes is written in its constructor. Also the two ways the engine shows them by
DeepSpeed's names: `field_of` (an attribute) and `delegated` (a method)."""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from .. import comm
from ..checkpoint.target import TrainingCounters
from ..zero.protocol import RunState, TrainingState


@dataclass
class EngineCounters:
    """DeepSpeed's engine counters (`engine.global_steps` and the rest read these).
    micro_steps counts step() calls; global_steps the accumulation boundaries, skipped ones
    included; skipped_steps those that overflowed; global_samples the samples trained on."""

    global_steps: int = 0
    global_samples: int = 0
    micro_steps: int = 0
    skipped_steps: int = 0

    def saved(self) -> TrainingCounters:
        """What a checkpoint writes (micro_steps is not saved, as in DeepSpeed)."""
        return TrainingCounters(self.global_steps, self.global_samples, self.skipped_steps)

    def restore(self, loaded: TrainingCounters) -> None:
        self.global_steps = loaded.global_steps
        self.global_samples = loaded.global_samples
        self.skipped_steps = loaded.skipped_steps


@dataclass(frozen=True)
class Ranks:
    """This process's place in the run, fixed when the engine is made."""

    global_rank: int
    world_size: int
    dp_rank: int
    dp_world_size: int
    local_rank: int
    mp_world_size: int = 1  # zerostream has no model parallelism

    @classmethod
    def of(cls, dp_group: Any) -> "Ranks":
        return cls(
            global_rank=comm.get_rank(),
            world_size=comm.get_world_size(),
            dp_rank=comm.get_rank(dp_group),
            dp_world_size=comm.get_world_size(dp_group),
            local_rank=comm.get_local_rank(),
        )


@dataclass
class TrainingParts:
    """The engine's optimizer (its ZeRO optimizer, None without one) and LR scheduler: kept
    here, not copied, because a script may replace them after initialize()
    (`engine.lr_scheduler = ...`) and a checkpoint saves the ones it holds then."""

    optimizer: Any = None
    lr_scheduler: Any = None

    def require_optimizer(self, what: str) -> Any:
        if self.optimizer is None:
            raise RuntimeError(
                f"{what}: must provide optimizer during init in order to use backward/step"
            )
        return self.optimizer


@contextlib.contextmanager
def in_phase(run: RunState, state: TrainingState) -> Iterator[None]:
    """`state` is the run's phase inside the block (the stage's hooks read it)."""
    previous, run.state = run.state, state
    try:
        yield
    finally:
        run.state = previous


def field_of(record: str, name: str, writable: bool = False) -> property:
    """An engine attribute by DeepSpeed's name that is `record`'s field `name`: scripts read
    `engine.global_steps`, and some assign it (writable)."""

    def get(self: Any) -> Any:
        return getattr(getattr(self, record), name)

    def set(self: Any, value: Any) -> None:
        setattr(getattr(self, record), name, value)

    return property(get, set if writable else None, doc=f"{record}.{name}")


def delegated(collaborator: str, method: Callable) -> Callable:
    """An engine method that calls `method` on the engine's attribute `collaborator`; it keeps
    the method's name, docstring and signature (functools.wraps), so the engine's API reads
    as before."""

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        return method(getattr(self, collaborator), *args, **kwargs)

    return call
