"""zerostream: a DeepSpeed-compatible ZeRO runtime with CPU and NVMe offload.

`import zerostream as deepspeed` and keep the script: initialize, engine.backward, engine.step.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
from typing import Optional

from ._version import __version__

# The training API imports torch (about 3 s); commands that only read a config (`zerostream
# config check`, `estimate`) must not pay for it. So these come on first use (PEP 562):
# `zerostream.comm`, `from zerostream import zero`, `zerostream.get_accelerator()`.
_LAZY_MODULES = ("comm", "moe", "ops", "utils", "zero")
_LAZY_NAMES = {
    "get_accelerator": ".accelerator",
    "init_distributed": ".comm",
    "OnDevice": ".on_device",
}


def __getattr__(name: str):
    if name in _LAZY_MODULES:
        value = importlib.import_module(f".{name}", __name__)
    elif name in _LAZY_NAMES:
        value = getattr(importlib.import_module(_LAZY_NAMES[name], __name__), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


# Like DeepSpeed's logger: visible by default (warnings about the config, progress lines every
# steps_per_print), level from ZS_LOG_LEVEL; a script that configures logging itself can
# replace the handler.
_logger = logging.getLogger("zerostream")
if _logger.level == logging.NOTSET:
    _logger.setLevel(os.environ.get("ZS_LOG_LEVEL", "INFO").upper())
if not _logger.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("[zerostream] %(levelname)s %(message)s"))
    _logger.addHandler(_handler)
    _logger.propagate = False

__all__ = [
    "initialize",
    "init_distributed",
    "add_config_arguments",
    "comm",
    "moe",
    "ops",
    "utils",
    "zero",
    "OnDevice",
    "get_accelerator",
    "__version__",
]


def add_config_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds DeepSpeed's argument group: --deepspeed, --deepspeed_config (and the old
    --deepscale / --deepscale_config)."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument(
        "--deepspeed",
        default=False,
        action="store_true",
        help="Enable DeepSpeed (helper flag for user code, no impact on DeepSpeed backend)",
    )
    group.add_argument(
        "--deepspeed_config", default=None, type=str, help="DeepSpeed json configuration file."
    )
    group.add_argument(
        "--deepscale",
        default=False,
        action="store_true",
        help="Deprecated enable DeepSpeed (helper flag for user code, no impact "
        "on DeepSpeed backend)",
    )
    group.add_argument(
        "--deepscale_config",
        default=None,
        type=str,
        help="Deprecated DeepSpeed json configuration file.",
    )
    return parser


def _config_source(args, config, config_params):
    if config is None:
        config = config_params
    from_args = None
    if args is not None:
        from_args = getattr(args, "deepspeed_config", None) or getattr(
            args, "deepscale_config", None
        )
    if from_args is not None and config is not None:
        raise ValueError(
            "Not sure how to proceed, we were given deepspeed configs in the "
            "deepspeed arguments and deepspeed.initialize() function call"
        )
    config = config if config is not None else from_args
    if config is None:
        raise ValueError("DeepSpeed requires --deepspeed_config to specify configuration file")
    return config


def _model_dtype(model) -> Optional[str]:
    import torch

    names = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
    for p in model.parameters():
        return names.get(p.dtype)
    return None


class MissingModelError(ValueError, AssertionError):
    """initialize() without a model; an AssertionError too, as DeepSpeed asserts it."""


def initialize(
    args=None,
    model=None,
    optimizer=None,
    model_parameters=None,
    training_data=None,
    lr_scheduler=None,
    distributed_port: int = 29500,
    mpu=None,
    dist_init_required: Optional[bool] = None,
    collate_fn=None,
    config=None,
    mesh_param=None,
    config_params=None,
):
    """Returns (engine, optimizer, training_dataloader, lr_scheduler) like deepspeed.initialize."""
    if model is None:
        hint = (
            " (the first positional argument is `args`, as in DeepSpeed: pass model=...)"
            if callable(getattr(args, "parameters", None))  # a module given as args
            else ""
        )
        raise MissingModelError(f"deepspeed.initialize requires a model{hint}")
    from . import comm
    from . import config as config_mod
    from .comm import init_distributed
    from .data import make_dataloader
    from .engine import ZeroEngine

    source = _config_source(args, config, config_params)
    init_distributed(distributed_port=distributed_port, dist_init_required=dist_init_required)
    if args is not None and hasattr(args, "local_rank"):
        args.local_rank = comm.get_local_rank()
    dp_group = mpu.get_data_parallel_group() if mpu is not None else None
    world = mpu.get_data_parallel_world_size() if mpu is not None else comm.get_world_size()
    hidden = getattr(getattr(model, "config", None), "hidden_size", None)
    lr = None
    if optimizer is not None and hasattr(optimizer, "param_groups"):
        lr = optimizer.param_groups[0].get("lr")
    cfg = config_mod.load(
        source,
        world_size=world,
        hidden_size=hidden,
        model_dtype=_model_dtype(model),
        lr=lr,
        log=comm.get_rank() == 0,
    )
    loader = None
    if training_data is not None:
        loader = make_dataloader(training_data, cfg, collate_fn=collate_fn, group=dp_group)
        # ZenFlow's "epoch" selection counts epochs of this loader (DeepSpeed's rule); an
        # iterable dataset's loader has no length, and the config keeps its own value.
        if cfg.zero_optimization.zenflow is not None:
            try:
                steps = len(loader)
            except TypeError:
                steps = None
            if steps is not None:
                cfg = config_mod.with_steps_per_epoch(cfg, steps)
    engine = ZeroEngine(
        model,
        cfg,
        optimizer=optimizer,
        model_parameters=model_parameters,
        lr_scheduler=lr_scheduler,
        dp_group=dp_group,
    )
    engine.training_dataloader = loader
    return engine, _returned_optimizer(engine.optimizer), loader, engine.lr_scheduler


def _returned_optimizer(optimizer):
    """What initialize() hands back as its optimizer: DeepSpeed's rule. Without ZeRO and in
    fp32 it is the bare optimizer (the client's own object, or the config's FusedAdam), which
    the caller may step directly since the gradients are all-reduced at the end of the
    boundary's backward (Note [Stage 0 reduces at the boundary's backward] in
    zero/stage0.py); the engine keeps its wrapper. Otherwise the ZeRO or mixed-precision
    wrapper."""
    from .zero.stage0 import ReplicatedOptimizer

    if type(optimizer) is ReplicatedOptimizer and not optimizer.mixed:
        return optimizer.optimizer
    return optimizer
