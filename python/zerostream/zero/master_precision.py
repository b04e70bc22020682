"""The dtypes of a partitioned stage's optimizer state: master weights, optimizer states.

Note [16-bit master weights with an offloaded optimizer]
  bf16.bf16_master_weights_and_grads (DeepSpeed >= 0.18.3) keeps the master weights, and
  their gradients, in bf16; bf16.bf16_optimizer_states (which needs it) keeps the optimizer's
  moments in bf16 as well. With offload_optimizer "cpu" or "nvme" DeepSpeed then steps them
  with DeepSpeedCPUAdam over bf16 masters, with fp32_optimizer_states=False when the states
  are bf16. zerostream does the same with its CPU kernels (Note [16-bit masters and states]
  in csrc/optim/step_types.h): the update is computed in fp32 from the loaded values and
  each result rounded to nearest even once, on its store, as DeepSpeed's kernel does. Bytes
  of optimizer state an element: 2 + 2 x 4 (fp32 moments) or 2 + 2 x 2 (bf16), against 12.
  The 16-bit master is a copy of the 16-bit partition, as in DeepSpeed (the two are equal
  after every update; the copy is what the optimizer steps and checkpoints save).
  Gradients land in bf16 where nothing accumulates in them (gradient_accumulation_steps 1),
  as DeepSpeed's do. With accumulation zerostream accumulates them in fp32 (DeepSpeed
  accumulates in bf16): more exact, 2 more bytes an element of host memory.
  Without an offloaded optimizer the inner optimizer is a torch one over the bf16 masters
  (its moments are then bf16 like its params: the config rules require
  bf16_optimizer_states there).
"""

from __future__ import annotations

import torch

from ..ops._cpu_optimizer import CPUOptimizerBase
from ..sizing import optimizer_state_bytes
from .protocol import StageContext


def master_dtype(ctx: StageContext) -> torch.dtype:
    """bf16 under bf16.bf16_master_weights_and_grads, else fp32."""
    bf16 = ctx.config.bf16
    if bf16.enabled and bf16.bf16_master_weights_and_grads:
        return torch.bfloat16
    return torch.float32


def state_dtype(ctx: StageContext, optimizer=None) -> torch.dtype:
    """The optimizer moments' dtype: bf16 under bf16.bf16_optimizer_states (or a 16-bit
    master with the optimizer's fp32_optimizer_states false, DeepSpeed's reading), else fp32.
    `optimizer`: the optimizer section to read (a client's, zero/factory.py), else the
    config's."""
    if master_dtype(ctx) == torch.float32:
        return torch.float32
    opt = ctx.config.optimizer if optimizer is None else optimizer
    fp32_states = opt is None or opt.params.get("fp32_optimizer_states", True) is not False
    if ctx.config.bf16.bf16_optimizer_states or not fp32_states:
        return torch.bfloat16
    return torch.float32


def state_bytes(ctx: StageContext, states: int = 2) -> int:
    """Bytes an element of the master and `states` optimizer states (Adam: 2)."""
    bf16 = torch.bfloat16
    return optimizer_state_bytes(master_dtype(ctx) == bf16, state_dtype(ctx) == bf16, states)


def configure_inner(inner, ctx: StageContext, offloaded: bool) -> None:
    """Sets the inner optimizer up for 16-bit masters (Note [16-bit master weights with an
    offloaded optimizer]); nothing to do for fp32 ones. An offloaded optimizer must be one of
    zerostream's CPU optimizers, whose kernels step 16-bit masters; a client's is refused by
    name."""
    if master_dtype(ctx) == torch.float32 or not offloaded:
        return
    if not isinstance(inner, CPUOptimizerBase):
        raise ValueError(
            "bf16.bf16_master_weights_and_grads with zero_optimization.offload_optimizer "
            "needs DeepSpeedCPUAdam, DeepSpeedCPUAdagrad or DeepSpeedCPULion (their kernels "
            f"step bf16 master weights); got {type(inner).__name__}"
        )
    if any(len(st) for st in inner.state.values()):
        raise ValueError(
            f"{type(inner).__name__}: already holds state; a 16-bit master run needs a "
            "fresh optimizer"
        )
    inner.fp32_master_weights = False
    if state_dtype(ctx) != torch.float32:
        inner.fp32_optimizer_states = False
