"""Builds the ZeRO optimizer of a run from its stage and config sections (Note [Stage seam] in
zero/protocol.py): which class implements the stage, which inner optimizer steps the fp32
state, and where that state lives (device, host arena, or NVMe swap store)."""

from __future__ import annotations

import logging
from typing import List, Optional, Type

import torch

from .. import comm
from ..ops.muon import MuonWithAuxAdam
from ..optim_factory import (
    check_client_optimizer,
    client_groups,
    optimizer_maker,
    refuse_swapped_muon,
)
from . import param_access
from .base import ZeroOptimizerBase
from .protocol import StageContext, ZeroOptimizer
from .stage0 import ReplicatedOptimizer
from .stage3.optimizer import Stage3Optimizer
from .stage12 import PartitionedOptimizer

logger = logging.getLogger("zerostream")

_STAGES = {
    0: ReplicatedOptimizer,
    1: PartitionedOptimizer,
    2: PartitionedOptimizer,
    3: Stage3Optimizer,
}


def stage_class(stage: int) -> Type[ZeroOptimizerBase]:
    """The class implementing `zero_optimization.stage` (its prepare_module runs first)."""
    return _STAGES[stage]


def build_zero_optimizer(
    ctx: StageContext,
    param_groups: List[dict],
    client=None,
    cls: Optional[Type[ZeroOptimizerBase]] = None,
) -> Optional[ZeroOptimizer]:
    """The run's ZeRO optimizer over `param_groups` (trainable groups of the placed module),
    or None when the run has no optimizer (stage 0 inference). `cls`: the stage's class, as
    the engine looked it up (stage_class when not given)."""
    cfg = ctx.config
    stage = cfg.zero_stage
    cls = stage_class(stage) if cls is None else cls
    if cfg.zero_optimization.zenflow is not None:  # stages 1/2 only (engine/unsupported.py)
        from .zenflow.optimizer import ZenFlowOptimizer

        cls = ZenFlowOptimizer
    groups = client_groups(client, param_groups)
    _check_client_states(client, cfg)
    if isinstance(client, MuonWithAuxAdam):
        refuse_swapped_muon(cfg)
    if stage > 0 and _sub_grouped(cfg.zero_optimization, cfg.zerostream):
        if isinstance(client, torch.optim.Optimizer):
            check_client_optimizer(client, cfg)  # zero_force_ds_cpu_optimizer, as for "cpu"
        opt = cls(ctx, groups, None, make_swapped=_swapped_adam(ctx, client))
    else:
        make = optimizer_maker(client, cfg, groups)
        if make is None:
            if stage in (1, 2):
                raise ValueError(
                    f"zero_optimization.stage {stage} requires an optimizer: give "
                    f'one in the config\'s "optimizer" section or to initialize()'
                )
            return None
        opt = cls(ctx, groups, make)
    # deepspeed.utils.safe_get_full_fp32_param and friends find the optimizer of a param.
    param_access.register(opt, [p for g in groups for p in g["params"]])
    return opt


class ClientStatesError(ValueError, AssertionError):
    """A client CPU optimizer keeps fp32 moments where the config asks for bf16 ones. An
    AssertionError too, as DeepSpeed asserts it."""


def _check_client_states(client, cfg) -> None:
    """bf16.bf16_optimizer_states with an offloaded optimizer steps bf16 moments; a client
    DeepSpeedCPUAdam built with fp32 ones (its default) would contradict it, so neither is
    silently overridden (DeepSpeed refuses the same way)."""
    from ..ops._cpu_optimizer import CPUOptimizerBase

    bf16 = cfg.bf16
    if not (
        isinstance(client, CPUOptimizerBase)
        and client.fp32_optimizer_states
        and bf16.enabled
        and bf16.bf16_optimizer_states
        and cfg.zero_stage > 0
        and cfg.zero_optimization.offload_optimizer_device != "none"
    ):
        return
    raise ClientStatesError(
        f"bf16.bf16_optimizer_states keeps the optimizer's moments in bf16, but the "
        f"{type(client).__name__} given to initialize() keeps them in fp32: build it with "
        f"fp32_optimizer_states=False, or set bf16.bf16_optimizer_states false"
    )


def _sub_grouped(zero, ext) -> bool:
    """Whether the optimizer state is stepped sub-group by sub-group across tiers
    (offload/optimizer_swap.py): offload_optimizer "nvme", or "cpu" with a device tier (a
    ratio below 1, or zerostream.optimizer_max_on_device: Note [The device tier])."""
    device = zero.offload_optimizer_device
    if device != "cpu":
        return device == "nvme"
    return zero.offload_optimizer.ratio < 1.0 or ext.optimizer_max_on_device != 0


def _swapped_adam(ctx: StageContext, client):
    """offload_optimizer nvme (or a ratio below 1): Adam/AdamW whose master weights and
    moments live in sub-groups on the device, in host memory or in the swap store
    (offload/optimizer_swap.py), built from the config's sections."""
    from ..offload.optimizer_swap import SwappedAdam
    from .master_precision import master_dtype, state_dtype
    from .sharded import require_host_state

    cfg = ctx.config
    offload = cfg.zero_optimization.offload_optimizer
    if offload.device == "nvme":
        why = 'zero_optimization.offload_optimizer.device "nvme" keeps Adam/AdamW state on NVMe'
    elif offload.ratio < 1.0:
        why = (
            f"zero_optimization.offload_optimizer.ratio {offload.ratio} steps part of the "
            f"Adam/AdamW state on the device (DeepSpeed requires DeepSpeedCPUAdam there too)"
        )
    else:
        why = (
            f"zerostream.optimizer_max_on_device {cfg.zerostream.optimizer_max_on_device!r} "
            "steps part of the Adam/AdamW state on the device"
        )
    opt = cfg.optimizer if client is None else _client_adam(client, why)
    if opt is not None and opt.name in ("adam", "adamw") and opt.params["torch_adam"]:
        # torch_adam picks torch's implementation of the same update; on NVMe the state is
        # stepped where it is swapped in, by zerostream's kernel (equal to fp32 rounding).
        logger.info(
            'optimizer.params.torch_adam: with offload_optimizer "nvme" the Adam step runs in '
            "zerostream's swapped kernel (the update torch.optim.Adam/AdamW computes)"
        )
    if opt is None or opt.name not in ("adam", "adamw"):
        raise NotImplementedError(
            f'{why}; give "optimizer": {{"type": "AdamW", ...}} in the config, or a '
            "DeepSpeedCPUAdam or torch.optim.Adam/AdamW to initialize() (other optimizers "
            "are not supported there yet)"
        )

    def make(masters, options, param_starts, placer):
        # The stage's placer places its "auto" tiers, the parameter shards' first (Note
        # ["auto" is sized from a measured step]).
        return SwappedAdam(
            masters,
            options,
            param_starts,
            optimizer=opt,
            zero=cfg.zero_optimization,
            aio=cfg.aio,
            ext=cfg.zerostream,
            rank=comm.get_rank(),
            placer=placer,
            dtypes=(master_dtype(ctx), state_dtype(ctx, opt)),
            device=ctx.device,
            host_preflight=lambda numel: require_host_state(ctx, numel),
        )

    return make


def _client_adam(client, why: str):
    """A client's Adam as the config's optimizer section the NVMe optimizer is built from
    (its hyperparameters; its param groups come with the groups): DeepSpeedCPUAdam (what
    Accelerate and the HF Trainer pass for a config without an "optimizer" section) or
    torch.optim.Adam/AdamW. None for anything else (refused by the caller)."""
    from ..config import OptimizerConfig
    from ..ops.adam import DeepSpeedCPUAdam

    if isinstance(client, DeepSpeedCPUAdam):
        adamw, fp32_states = client.adamw_mode, client.fp32_optimizer_states
    elif type(client) in (torch.optim.Adam, torch.optim.AdamW):
        adamw, fp32_states = type(client) is torch.optim.AdamW, True
        for flag in ("amsgrad", "maximize"):
            if client.defaults.get(flag):
                raise NotImplementedError(
                    f"{why}: the client's {type(client).__name__}({flag}=True) is not "
                    f"supported there"
                )
    else:
        return None
    d = client.defaults
    params = {
        "lr": d["lr"],
        "betas": tuple(d["betas"]),
        "eps": d["eps"],
        "weight_decay": d["weight_decay"],
        "bias_correction": d.get("bias_correction", True),
        "adam_w_mode": adamw,
        "torch_adam": False,
        "fp32_optimizer_states": fp32_states,
    }
    return OptimizerConfig("AdamW" if adamw else "Adam", params, legacy_fusion=False)
