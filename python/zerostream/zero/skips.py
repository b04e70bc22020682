"""What a skipped step means, decided on every rank alike.

A step is skipped when the reduced gradients hold inf or NaN. With fp16 that is the loss
scaler's business (it lowers the scale and tries again); with bf16 and fp32 there is nothing to
lower. Two things are never an overflow, and a run must not "train" on through them:

  * inf/NaN in the fp32 weights or optimizer state (a corrupt swap file read with checksums
    off, a diverged update): every later step would be skipped too. Checked on every skipped
    step, where it is cheap (skips are rare), and raised as NonFiniteStateError naming the
    state, the sub-group and its swap file.
  * a run of skips with no end: `zerostream.max_consecutive_skipped_steps` (default 50; 0
    never stops) in a row stop the run with an error that says so, in every precision.

Each rank holds only its partition of the state, so the finding is all-reduced: every rank
raises (the one that saw the values with the details), none is left waiting in a collective.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch

from .. import comm

logger = logging.getLogger("zerostream")


class NonFiniteStateError(RuntimeError):
    """The fp32 weights or the optimizer state hold inf/NaN: not a gradient overflow."""


class SkippedStepsError(RuntimeError):
    """Too many steps in a row were skipped for inf/NaN gradients."""


class SkipGuard:
    def __init__(self, optimizer, *, precision: str, limit: int, fp16: bool, group, world: int):
        self.optimizer = optimizer
        self.precision = precision
        self.limit = limit
        self.fp16 = fp16
        self.group = group
        self.world = world
        self.in_a_row = 0

    def applied(self) -> None:
        self.in_a_row = 0

    def skipped(self, step: int, total_skipped: int) -> None:
        """Called on every rank after step `step` (1-based) was skipped."""
        self.in_a_row += 1
        self._raise_if_state_not_finite(step)
        if not self.fp16 and comm.get_rank() == 0:
            # fp16's loss scaler logs its own overflow; bf16 and fp32 have no scale to lower,
            # so a skip there means the gradients themselves are bad.
            logger.warning(
                "step %d skipped: the gradients hold inf or NaN (%s has no loss scale to "
                "lower); %d steps skipped so far",
                step,
                self.precision,
                total_skipped,
            )
        if self.limit and self.in_a_row >= self.limit:
            raise SkippedStepsError(
                f"[rank {comm.get_rank()}] the last {self.in_a_row} steps (up to step {step}) "
                f"were all skipped because the gradients held inf or NaN ({self.precision}"
                f"{', the loss scale could not recover' if self.fp16 else ''}); the weights and "
                f"optimizer state are finite, so the loss or the data is the cause (a learning "
                f"rate too high, a bad batch, a log of 0). Stopping "
                f"(zerostream.max_consecutive_skipped_steps: {self.limit}; 0 never stops)."
            )

    def _raise_if_state_not_finite(self, step: int) -> None:
        check = getattr(self.optimizer, "non_finite_state", None)
        found: Optional[str] = check() if check is not None else None
        rank = comm.get_rank()
        culprit = comm.first_failed_rank(
            found is not None, group=self.group, world=self.world, device=_device(self.optimizer)
        )
        if culprit < 0:
            return
        if found:
            raise NonFiniteStateError(
                f"[rank {rank}] step {step}: {found}. The gradients are not the cause, so "
                f"this is not an overflow, and every later step would be skipped too. A swap "
                f"file changed on disk (zerostream.verify_swap_checksums: true checks every "
                f"read) or the update diverged; resume from the last checkpoint."
            )
        raise NonFiniteStateError(
            f"[rank {rank}] step {step}: stopping because the fp32 weights or optimizer "
            f"state of global rank {culprit} hold inf/NaN (its error names them)"
        )


def _device(optimizer) -> torch.device:
    ctx = getattr(optimizer, "ctx", None)
    return ctx.device if ctx is not None else torch.device("cpu")


def first_non_finite(t: torch.Tensor, chunk: int = 1 << 24) -> int:
    """Index of `t`'s first inf/NaN element, or -1 (chunked: bounded temporaries)."""
    if not t.is_floating_point():
        return -1
    flat = t.detach().reshape(-1)
    for start in range(0, flat.numel(), chunk):
        bad = ~torch.isfinite(flat[start : start + chunk])
        if bool(bad.any()):
            return start + int(bad.nonzero()[0, 0])
    return -1
