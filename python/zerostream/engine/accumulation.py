"""Between two optimizer steps, by DeepSpeed's names: the accumulation boundary
(`is_gradient_accumulation_boundary`, `set_gradient_accumulation_boundary`), the windows that
defer the gradient reduction (`no_sync`, `coalesce_grad_reduction`) and who reduces
(`enable_backward_allreduce`, `allreduce_gradients`). A collaborator the engine holds, built
from the config's accessors, the stage's class and the records it reads (records.py); the
engine's methods of the same names call it, and its step() asks it where the boundary is.

Note [Who owns the accumulation boundary]
Managed (DeepSpeed's default): the engine counts micro-steps; the caller calls step() after
every backward and the update happens on every gradient_accumulation_steps-th. With
`managed_gradient_accumulation: false` the caller owns the boundary: it runs any number of
backwards and then step(), and every step() reduces what was accumulated and updates. The
loss is still divided by gradient_accumulation_steps (scale_wrt_gas), the boundary is True only
while step() runs, global_samples advances by the micro-batches actually run, and
set_gradient_accumulation_boundary is refused, as in DeepSpeed. zerostream's stages accumulate
in backward without asking about the boundary (stages 2/3 reduce into their partitions as
gradients arrive, 0/1 at the step), so only the engine's bookkeeping changes."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Iterator, Optional, Type

from ..zero.protocol import RunState, TrainingState
from .accessors import Accessors
from .records import EngineCounters, TrainingParts, in_phase

if TYPE_CHECKING:
    from ..zero.base import ZeroOptimizerBase


class NoSyncError(RuntimeError, ValueError, AssertionError):
    """A misuse of no_sync(). DeepSpeed asserts these (its message is quoted in ours), so
    code that catches AssertionError, DeepSpeed's tests among it, catches them too; the
    RuntimeError (step, re-entry) and ValueError (stage) zerostream raised before, too."""


class GradientAccumulation:
    def __init__(
        self,
        accessors: Accessors,
        stage: "Type[ZeroOptimizerBase]",
        counters: EngineCounters,
        parts: TrainingParts,
        run: RunState,
    ):
        self._ask = accessors
        self._stage = stage
        self._counters = counters
        self._parts = parts
        self._run = run
        self.managed = accessors.managed_gradient_accumulation()
        self._override: Optional[bool] = None  # set_gradient_accumulation_boundary's
        self._backwards = 0  # managed false: the backwards since the last step
        self.running_step = False  # step() runs: the boundary when the caller owns it
        self.in_window = False  # no_sync() or coalesce_grad_reduction() is open
        self._backward_allreduce = True
        self.pipeline_parallelism = False  # PipelineModule is refused (unsupported.py)

    # --- the boundary ---------------------------------------------------------------------------
    def is_gradient_accumulation_boundary(self) -> bool:
        if not self.managed:
            return self.running_step
        if self._override is not None:
            return self._override
        return (self._counters.micro_steps + 1) % self._ask.gradient_accumulation_steps() == 0

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        if not self.managed:
            raise NoSyncError(
                "set_gradient_accumulation_boundary: not allowed with "
                "managed_gradient_accumulation false; the caller owns the boundary by calling "
                "step()"
            )
        self._override = bool(is_boundary)

    def backward_ran(self) -> None:
        if not self.managed:
            self._backwards += 1

    def micro_step_ended(self) -> None:
        self._counters.micro_steps += 1
        self._override = None

    def samples_this_step(self) -> int:
        if self.managed:
            return self._ask.train_batch_size()
        per_micro = self._ask.train_batch_size() // self._ask.gradient_accumulation_steps()
        samples, self._backwards = per_micro * self._backwards, 0
        return samples

    # --- deferring the reduction ------------------------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Skips gradient reduction inside the context (stages 0 and 1 only)."""
        if self._ask.zero_optimization_partition_gradients():  # DeepSpeed's own test
            stage = self._ask.zero_optimization_stage()
            raise NoSyncError(
                f"no_sync is not compatible with ZeRO stage {stage}: gradients are partitioned "
                f"as they are produced (no_sync context manager is incompatible with gradient "
                f"partitioning logic of ZeRO stage {stage})"
            )
        if self.in_window:
            raise NoSyncError(
                "no_sync: the context is not re-entrant (no_sync context manager reentry is "
                "unsupported)"
            )
        self.in_window = True
        try:
            yield
        finally:
            self.in_window = False

    @contextlib.contextmanager
    def coalesce_grad_reduction(self) -> Iterator[None]:
        """One gradient reduction for all the backwards inside the block (DeepSpeed's): they
        accumulate locally and the block's end reduces once; step() comes after the block.
        Note [Coalesced reduction] in zero/base.py. Unlike DeepSpeed, stage 0 and ZeRO-1's
        bf16 wrapper are not refused (they reduce at the step anyway)."""
        optimizer = self._parts.require_optimizer("coalesce_grad_reduction")
        if not self.managed:
            raise NoSyncError(
                "coalesce_grad_reduction is not supported with managed_gradient_accumulation "
                "false: the caller already owns the accumulation boundary through step()"
            )
        if self.pipeline_parallelism:
            raise NotImplementedError(
                "coalesce_grad_reduction is not supported under pipeline parallelism"
            )
        if self.in_window:
            raise NoSyncError(
                "coalesce_grad_reduction cannot be nested inside another no_sync or "
                "coalesce_grad_reduction context"
            )
        self.in_window = True
        optimizer.begin_coalescing()
        try:
            yield
        except BaseException:
            self.in_window = False
            optimizer.end_coalescing(reduce=False)
            raise
        self.in_window = False
        with in_phase(self._run, TrainingState.BACKWARD):
            optimizer.end_coalescing()

    # --- who reduces ------------------------------------------------------------------------------
    def enable_backward_allreduce(self) -> bool:
        """DeepSpeed's switch for the engine's own gradient averaging. Set False at ZeRO
        stage 0, the caller reduces the gradients itself (its own hooks, or
        allreduce_gradients()) and step() applies them as they are. Stages 1-3 reduce into
        partitions as part of the step's math: refused there by name."""
        return self._backward_allreduce

    def set_enable_backward_allreduce(self, value: bool) -> None:
        value = bool(value)
        if not value and not self._stage.caller_may_reduce:
            stage = self._ask.zero_optimization_stage()
            raise NotImplementedError(
                f"enable_backward_allreduce = False is supported at ZeRO stage 0 only; at "
                f"stage {stage} zerostream reduces gradients into this rank's partition as "
                f"part of the step (use no_sync() or coalesce_grad_reduction() to defer it)"
            )
        self._backward_allreduce = value
        if self._parts.optimizer is not None:
            self._parts.optimizer.backward_allreduce = value

    def allreduce_gradients(self, bucket_size: Optional[int] = None) -> None:
        """DeepSpeed's: reduce the gradients of the backwards so far across the
        data-parallel ranks, at the accumulation boundary. At stage 0 they are averaged now
        (also with enable_backward_allreduce False), and the step does not reduce them
        again. Stages 1-3 have nothing left to do here: their backward reduced into the
        partitions already (stage 1 reduces in the step), so it is a no-op there, as the
        repeat of a finished reduction is in DeepSpeed. `bucket_size` is accepted for
        DeepSpeed's signature; the buckets are zero_optimization.reduce_bucket_size."""
        optimizer = self._parts.require_optimizer("allreduce_gradients")
        if self._stage.caller_may_reduce and self.is_gradient_accumulation_boundary():
            optimizer.allreduce_now()
