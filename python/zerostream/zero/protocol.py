"""The engine's stage seam: what ZeroEngine calls on its ZeRO optimizer, the training phase it
owns, and the one context object every stage is built from.

Note [Stage seam]
  Per micro-step the engine calls, in this order:
    before_forward() -> module forward -> after_forward()
    -> run_backward(loss, factor): autograd (the stage's hooks run here, phase BACKWARD)
       then after_backward()
  and at the accumulation boundary step() (which reduces what is still unreduced, unscales,
  clips and updates) then after_step() (whole-step bookkeeping: the placement's measuring
  window, offload/placement/) and zero_grad(). prepare_module() runs once, before the
  optimizer is built, because where parameters live is the stage's decision (under
  zero.Init they arrive already partitioned). state_dict()/load_state_dict() carry the
  optimizer side of a checkpoint and partition_layout() says how it is cut (Note [Stage
  checkpoints]); state_summary() is what tests and tools may inspect. release_gathered()
  (engine.empty_partition_cache) and close() (engine.destroy) are the stage's too, so the
  engine never reaches into a stage's runtime.
  The phase (TrainingState) is kept apart from where bytes live (the stage's own state).

Note [Stage checkpoints]
  checkpoint/ knows DeepSpeed's files: their names and keys, how each stage's partitions
  are laid out in them, DeepSpeed's own variants, and how to re-cut saved partitions by
  parameter name for another world size or stage. A stage knows where its weights and
  optimizer state live. They meet in a StageCheckpoint, which the engine has the stage
  build for each save or load (`checkpointer(module, optimizer)`) and hands to checkpoint/
  inside a CheckpointTarget (checkpoint/target.py); checkpoint/ imports no stage.
  - The files follow from what the stage states: `sharded_weights` (stage 3: every rank
    writes its own model-states file, with its shards of the frozen params; else DP rank 0
    writes the one file) and its PartitionLayout (`partitioned`: the optimizer state is cut
    into per-rank optim-states files, else it rides whole in the model-states file;
    `groups`: the flatten order, saved as param_shapes).
  - A save takes the stage's state (save_partition_state, frozen_values) and writes it.
  - A load reads the files, maps DeepSpeed's variants and re-cuts what it must into the
    stage's own layout (which pieces of each parameter this rank owns is the stage's
    answer, PartitionLayout.pieces), then hands it over: load_module (reading the saved
    weights through a SavedWeights: this rank's file, or whole values consolidated from
    every rank's), load_partition_state, and once every rank succeeded publish_loaded, the
    one collective (Note [A load that fails part way] in checkpoint/load.py).
  Large saved tensors may arrive as LazyTensors (lazy_tensor.py), read straight into place.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    List,
    Optional,
    Protocol,
    Set,
    Tuple,
    runtime_checkable,
)

import torch

from ..precision import DTYPES
from ..profiling.timers import NULL_PHASE_TIMERS, PhaseTimers
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

    def set_inconsistent(self, why: Optional[str]) -> None:
        self.inconsistent = why

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
    # wall_clock_breakdown's timers (profiling/timers.py): the stage times a backward's
    # autograd ("backward_inner") and its gradient hand-off ("backward_allreduce").
    timers: PhaseTimers = NULL_PHASE_TIMERS
    module_state: Any = None  # what prepare_module left for the optimizer (stage 3's runtime)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype parameters train in (fp16/bf16/fp32, from the precision sections)."""
        return DTYPES[self.config.precision]

    @property
    def grad_accum_dtype(self) -> torch.dtype:
        """Where micro-steps' gradients add up before the step (data_types.grad_accum_dtype,
        DeepSpeed's rule: the model's dtype unless set): stage 1's local buffer, the
        gradients a coalesced block holds; stages 2 and 3 add reduced gradients into fp32
        partitions, and into 16-bit ones only when this is the model's dtype."""
        from ..config import dtype_name

        name = dtype_name(self.config.data_types.grad_accum_dtype)
        return self.dtype if name is None else DTYPES[name]

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

    @classmethod
    def checkpointer(cls, module: torch.nn.Module, optimizer: Any) -> "StageCheckpoint":
        """The stage's side of a checkpoint (Note [Stage checkpoints]); `optimizer` is None in
        a run without one."""

    @classmethod
    def release_gathered(cls, module: torch.nn.Module) -> None:
        """Frees every gathered full parameter that is not persistent (stage 3)."""

    @classmethod
    def close(cls, module: torch.nn.Module, optimizer: Any) -> None:
        """Ends the stage: copies in flight finish, module hooks go, swap files are deleted."""

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

    def after_step(self) -> None:
        """After each optimizer step (applied or skipped): the stage's bookkeeping of whole
        steps (the placement's measuring window)."""

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

    def partition_layout(self) -> "PartitionLayout":
        """How this rank's optimizer state is cut (Note [Stage checkpoints])."""

    def state_summary(self) -> dict:
        """Plain data about where the state lives and what moved (tests, tools)."""

    @property
    def param_groups(self) -> List[dict]: ...

    @property
    def global_grad_norm(self) -> Optional[float]: ...


# --- checkpoints (Note [Stage checkpoints]) ----------------------------------------------------
@dataclass(frozen=True)
class PartitionLayout:
    """How a stage's optimizer state is cut and what it holds now: what checkpoint/ needs to
    tell whether saved partitions load as they are, to re-cut them by parameter name when
    not, and to map DeepSpeed's variants of the state."""

    zero_stage: int  # the `zero_stage` its state_dict carries (and messages name)
    partitioned: bool  # cut over the ranks (stages 1-3); else whole on every rank
    groups: List[List[torch.nn.Parameter]]  # trained params per param group, flatten order
    param_groups: List[dict]  # the inner optimizer's groups (this run's hyperparameter keys)
    loss_scaler: dict  # the loss scaler's state now (what a saved one lacks comes from it)
    fp32_masters: bool  # fp32 master copies are kept apart from the weights
    # This rank's partition of each group: its elements, and the pieces of parameters that
    # fill it, (index in the group, first element, end element, offset in the partition);
    # what the pieces leave out is padding. Empty where not partitioned.
    numels: List[int] = field(default_factory=list)
    pieces: List[List[Tuple[int, int, int, int]]] = field(default_factory=list)
    partition_count: Any = None  # its state_dict's `partition_count`


class SavedWeights(Protocol):
    """The module side of a checkpoint as checkpoint/ hands it to StageCheckpoint.load_module:
    this rank's model-states file and readers of whole values from every rank's files."""

    module: dict  # the file's module state (LazyTensors where read lazily)
    buffer_names: List[str]
    trained: Set[str]  # the params the saving run's optimizer trained (its param_shapes)
    frozen_fragments: Dict[str, Any]  # this rank's saved values of the frozen params
    sharded: bool  # saved with sharded weights (stage 3: per-rank model-states files)
    same_world: bool  # saved by as many data-parallel ranks as this run has

    def consolidated(self) -> Dict[str, torch.Tensor]:
        """Whole fp32 values of every param, from every rank's files (zero_to_fp32)."""

    def frozen(self) -> Dict[str, torch.Tensor]:
        """Whole values of the frozen params of a sharded checkpoint (every rank's model-states
        file holds its shard of them); the optimizer files are not read."""


@runtime_checkable
class StageCheckpoint(Protocol):
    """A stage's side of a checkpoint (Note [Stage checkpoints]). Implemented by
    zero/checkpoint.py (stages 0-2) and zero/stage3/checkpoint.py."""

    # Each rank holds shards of the weights (stage 3): every rank writes its own model-states
    # file, and saved weights are written into shards, never streamed into whole tensors.
    sharded_weights: bool

    def partition_layout(self) -> Optional[PartitionLayout]:
        """How the optimizer's state is cut; None when the run has no optimizer."""

    def save_partition_state(self, streamed: bool = False) -> dict:
        """This rank's optimizer state in the stage's file layout (ZeroOptimizer.state_dict)."""

    def frozen_values(self, named: List[Tuple[str, torch.nn.Parameter]]) -> Dict[str, torch.Tensor]:
        """The saved value of each (name, param) no optimizer trains: whole, or this rank's
        shard of it."""

    def load_module(
        self,
        saved: SavedWeights,
        strict: bool,
        custom_load_fn: Optional[Callable],
        with_optimizer: bool,
    ) -> None:
        """This rank's weights and buffers from `saved` (no collective). `with_optimizer`:
        load_partition_state follows and writes the trained weights."""

    def load_partition_state(self, state: dict) -> None:
        """This rank's optimizer state, already in the stage's layout (no collective)."""

    def loaded_without_optimizer(self) -> None:
        """The weights were loaded and the optimizer state was not: fp32 masters follow."""

    def publish_loaded(self, with_optimizer: bool) -> None:
        """The collective half of a load: every rank's weights from what each loaded."""
