"""The engine's stage seam: what ZeroEngine calls on its ZeRO optimizer, the training phase it
owns, and the one context object every stage is built from.

Note [Stage seam]
  Per micro-step the engine calls, in this order:
    before_forward() -> module forward -> after_forward()
    -> run_backward(loss, factor): autograd (the stage's hooks run here, phase BACKWARD)
       then after_backward()
  and at the accumulation boundary step() (which reduces what is still unreduced, unscales,
  clips and updates) followed by zero_grad(). prepare_module() runs once, before the
  optimizer is built, because where parameters live is the stage's decision (under
  zero.Init they arrive already partitioned). state_dict()/load_state_dict() carry the
  optimizer side of a checkpoint; state_summary() is what tests and tools may inspect.
  The phase (TrainingState) is kept apart from where bytes live (the stage's own state).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, List, Optional, Protocol, runtime_checkable

import torch

from ..precision import DTYPES
from ..telemetry import NULL_TELEMETRY

if TYPE_CHECKING:
    from ..config import DeepSpeedConfig
    from ..precision import LossScaler


class TrainingState(enum.Enum):
    """Which phase of a training step runs now (model: FSDP2's TrainingState)."""

    IDLE = "idle"
    FORWARD = "forward"
    BACKWARD = "backward"
    STEP = "step"


class RunState:
    """The engine's phase, shared by reference with the stage so its hooks can see it."""

    def __init__(self) -> None:
        self.state = TrainingState.IDLE
        # Why the engine's state cannot be trained on (a load_checkpoint that failed part
        # way, checkpoint/load.py); None when it can.
        self.inconsistent: Optional[str] = None

    def require_consistent(self, what: str) -> None:
        if self.inconsistent is not None:
            raise RuntimeError(f"{what}: {self.inconsistent}")

    def require(self, *allowed: TrainingState, what: str) -> None:
        if self.state not in allowed:
            names = " or ".join(s.value for s in allowed)
            raise RuntimeError(f"{what} during {self.state.value}; expected {names}")


@dataclass
class StageContext:
    """Everything a stage is built from: the resolved config (each component reads its own
    sections from it), the data-parallel group, the device and dtype the model trains in,
    the loss scaler, the engine's phase and telemetry."""

    config: "DeepSpeedConfig"
    group: Any
    rank: int
    world: int
    device: torch.device
    loss_scaler: "LossScaler"
    run: RunState = field(default_factory=RunState)
    telemetry: Any = NULL_TELEMETRY
    module_state: Any = None  # what prepare_module left for the optimizer (stage 3's runtime)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype parameters train in (fp16/bf16/fp32, from the precision sections)."""
        return DTYPES[self.config.precision]

    @property
    def check_overflow(self) -> bool:
        """Skip the step on inf/nan gradients: fp16 always, bf16 unless
        bf16.check_grad_overflow is false (DeepSpeed's rule), fp32 too (a non-finite update
        would silently destroy the weights)."""
        bf16 = self.config.bf16
        return not (bf16.enabled and not bf16.check_grad_overflow)


@runtime_checkable
class ZeroOptimizer(Protocol):
    """See Note [Stage seam]. Implemented by zero/stage0.py, zero/stage12.py and zero/stage3/."""

    @classmethod
    def prepare_module(cls, module: torch.nn.Module, ctx: StageContext) -> None:
        """Places the module's parameters and buffers and makes ranks agree on them."""

    def before_forward(self) -> None: ...

    def after_forward(self) -> None: ...

    def backward(self, loss: torch.Tensor, retain_graph: bool = False) -> None:
        """DeepSpeed's optimizer.backward: run_backward scaled by the loss scale only."""

    def run_backward(self, loss: torch.Tensor, factor: float, retain_graph: bool = False) -> None:
        """Autograd of loss * factor in the BACKWARD phase, then after_backward()."""

    def after_backward(self) -> None:
        """loss.backward() returned: finish this micro-step's gradient hand-off."""

    def step(self) -> bool:
        """At the accumulation boundary: reduce, unscale, clip, update. False: skipped
        (overflow)."""

    def zero_grad(self, set_to_none: bool = True) -> None: ...

    def state_dict(self, streamed: bool = False) -> dict:
        """This rank's optimizer state (DeepSpeed's layout for the stage). `streamed`: state
        that lives on disk may come as sources the checkpoint writer streams (objects with
        `shape`, `dtype` and `chunks()`, checkpoint/stream.py) instead of whole tensors."""

    def load_state_dict(self, state: dict, publish: bool = True) -> None:
        """Restores this rank's state (local work only when `publish` is False: the caller
        then calls publish_loaded() once every rank has loaded, see checkpoint/load.py)."""

    def publish_loaded(self) -> None:
        """The collective half of a load: every rank's weights from the loaded partitions."""

    def refresh_masters(self) -> None:
        """fp32 masters from the weights (a checkpoint loaded without optimizer state)."""

    def state_summary(self) -> dict:
        """Plain data about where the state lives and what moved (tests, tools)."""

    @property
    def param_groups(self) -> List[dict]: ...

    @property
    def global_grad_norm(self) -> Optional[float]: ...
