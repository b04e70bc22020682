"""Activation checkpointing with DeepSpeed's API (`deepspeed.checkpointing`).

`checkpoint(function, *args)` runs `function` without keeping its intermediate activations
and runs it again during backward to rebuild them, so only the inputs are saved. It is the
reentrant kind (an autograd Function around the call, as DeepSpeed's and as
`torch.utils.checkpoint(use_reentrant=True)`): the recomputation runs inside backward, where
zerostream's stage 3 gathers the function's parameters again (zero/grad_reduce.py handles a
gradient hook firing during that recomputation).

`configure(...)` sets the `activation_checkpointing` options, from a ds_config or from
arguments (arguments win), as DeepSpeed's does:

- `cpu_checkpointing` (checkpoint_in_cpu): the saved inputs are parked in page-locked host
  memory in the forward and brought back for the recomputation, both on a copy stage's
  lanes, one ahead in backward (Note [Parked activations] in offload/saved_activations.py).
- `synchronize_checkpoint_boundary` (synchronize): the accelerator is synchronized before
  and after each checkpointed forward and recomputation.
- `profile`: each checkpointed forward and recomputation logs its time on rank 0.
- `partition_activations` splits saved inputs over the model-parallel group. zerostream runs
  model-parallel size 1, where that group is one rank and there is nothing to split, so it is
  accepted as DeepSpeed behaves there; an `mpu_` whose model-parallel size exceeds 1 is refused
  (tensor parallelism).
- `contiguous_memory_optimization` (contiguous_checkpointing) copies partitioned activations
  into preallocated buffers to limit allocator fragmentation on a GPU. zerostream does not do
  that, so True is refused by name rather than accepted and ignored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from typing import Any, Callable, Optional

import torch
import torch.utils.checkpoint

from ..offload import saved_activations
from .rng_tracker import CudaRNGStatesTracker, get_cuda_rng_tracker, model_parallel_cuda_manual_seed

logger = logging.getLogger("zerostream")

_SECTION = "activation_checkpointing"


@dataclasses.dataclass
class Settings:
    configured: bool = False
    partition_activations: bool = False
    contiguous_memory_optimization: bool = False
    number_checkpoints: Optional[int] = None
    cpu_checkpointing: bool = False
    synchronize_checkpoint_boundary: bool = False
    profile: bool = False


_settings = Settings()


class CheckpointingConfigError(ValueError):
    """A configure() request zerostream cannot honour; names the option."""


def _section_of(deepspeed_config: Any) -> dict:
    """The `activation_checkpointing` section of a ds_config given as a dict, a path or a
    DeepSpeedConfig-like object (its `_param_dict`, or a dataclass section)."""
    if deepspeed_config is None:
        return {}
    section = getattr(deepspeed_config, _SECTION, None)
    if section is not None and dataclasses.is_dataclass(section):
        return dataclasses.asdict(section)
    raw = getattr(deepspeed_config, "_param_dict", None)
    if raw is None:
        from ..config import config_text

        text, _ = config_text(deepspeed_config)
        raw = json.loads(text)
    section = raw.get(_SECTION, {})
    if not isinstance(section, dict):
        raise CheckpointingConfigError(
            f"{_SECTION}: expected an object, got {type(section).__name__}"
        )
    return section


def _model_parallel_size(mpu_) -> int:
    if mpu_ is None:
        return 1
    for name in ("get_model_parallel_world_size", "get_tensor_model_parallel_world_size"):
        fn = getattr(mpu_, name, None)
        if fn is not None:
            return int(fn())
    return 1


def configure(
    mpu_,
    deepspeed_config=None,
    partition_activations: Optional[bool] = None,
    contiguous_checkpointing: Optional[bool] = None,
    num_checkpoints: Optional[int] = None,
    checkpoint_in_cpu: Optional[bool] = None,
    synchronize: Optional[bool] = None,
    profile: Optional[bool] = None,
) -> None:
    """Sets the checkpointing options: the config's section first, then each argument that
    is not None."""
    mp = _model_parallel_size(mpu_)
    if mp > 1:
        raise CheckpointingConfigError(
            f"deepspeed.checkpointing.configure: the mpu_ has model-parallel size {mp}; "
            "tensor parallelism is not supported by zerostream (partitioned activations need it)"
        )
    section = _section_of(deepspeed_config)
    known = {f.name for f in dataclasses.fields(Settings)} - {"configured"}
    unknown = sorted(set(section) - known)
    if unknown:
        raise CheckpointingConfigError(f"{_SECTION}: unknown keys {unknown}")
    new = Settings(configured=True, **{k: v for k, v in section.items() if v is not None})
    for name, value in (
        ("partition_activations", partition_activations),
        ("contiguous_memory_optimization", contiguous_checkpointing),
        ("number_checkpoints", num_checkpoints),
        ("cpu_checkpointing", checkpoint_in_cpu),
        ("synchronize_checkpoint_boundary", synchronize),
        ("profile", profile),
    ):
        if value is not None:
            setattr(new, name, value)
    if new.contiguous_memory_optimization:
        if not new.partition_activations:
            raise CheckpointingConfigError(
                f"{_SECTION}.contiguous_memory_optimization needs partition_activations "
                "(DeepSpeed refuses it alone too)"
            )
        raise CheckpointingConfigError(
            f"{_SECTION}.contiguous_memory_optimization: contiguous activation buffers are not "
            "supported by zerostream; set it to false (at model-parallel size 1 partitioned "
            "activations are whole tensors, so it would only change allocator fragmentation)"
        )
    global _settings
    _settings = new


def is_configured() -> bool:
    return _settings.configured


def reset() -> None:
    """Forgets the configuration (DeepSpeed's reset also frees its contiguous buffers, which
    zerostream does not allocate)."""
    global _settings
    _settings = Settings()
    saved_activations.forget_parkings()


def settings() -> Settings:
    """A copy of the options in force."""
    return dataclasses.replace(_settings)


def _offload_pack(t: torch.Tensor):
    """Saved-tensor hook of cpu_checkpointing: the saved input is parked in page-locked host
    memory through a copy stage (Note [Parked activations] in offload/saved_activations.py).
    A CPU tensor already is in host memory; another accelerator's is copied with a blocking
    `.to("cpu")`, as DeepSpeed does."""
    if saved_activations.moves_to_host(t.device):
        return saved_activations.parking_for(t.device).park(t)
    if t.device.type == "cpu":
        return t
    return (t.device, t.to("cpu"))


def _offload_unpack(packed):
    if isinstance(packed, saved_activations.Parked):
        return saved_activations.parking_for(packed.device).fetch(packed)
    if isinstance(packed, torch.Tensor):
        return packed
    device, t = packed
    return t.to(device)


def _sync() -> None:
    from ..accelerator import get_accelerator

    get_accelerator().synchronize()


class _Boundary:
    """What the options do around one checkpointed call: synchronize, time, log."""

    def __init__(self, what: str):
        self.what = what
        self.opts = _settings

    def __enter__(self):
        if self.opts.synchronize_checkpoint_boundary:
            _sync()
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.opts.synchronize_checkpoint_boundary:
            _sync()
        if self.opts.profile:
            from .. import comm

            if comm.get_rank() == 0:
                ms = (time.perf_counter() - self.start) * 1e3
                logger.info("activation checkpoint %s: %.3f ms", self.what, ms)
        return False


def _run(function: Callable, args, use_reentrant: bool) -> Any:
    opts = _settings
    if opts.cpu_checkpointing and not use_reentrant:
        raise CheckpointingConfigError(
            f"{_SECTION}.cpu_checkpointing: the non-reentrant checkpoint keeps its inputs "
            "where they are; use deepspeed.checkpointing.checkpoint (reentrant) to move them "
            "to host memory, or set cpu_checkpointing to false"
        )
    calls = 0
    tracker = get_cuda_rng_tracker()
    forward_states = tracker.get_states()

    def bounded(*a):
        # The first call is the forward (under no_grad when reentrant); any later one is the
        # recomputation that backward runs, which draws from the tracked states the forward
        # started from (rng_tracker.py: torch restores only the default generators).
        nonlocal calls
        what = "forward" if calls == 0 else "recompute"
        calls += 1
        replay = tracker.replaying(forward_states) if what == "recompute" else None
        with _Boundary(what), replay or contextlib.nullcontext():
            return function(*a)

    hooks = (
        torch.autograd.graph.saved_tensors_hooks(_offload_pack, _offload_unpack)
        if opts.cpu_checkpointing
        else contextlib.nullcontext()
    )
    with hooks:
        return torch.utils.checkpoint.checkpoint(bounded, *args, use_reentrant=use_reentrant)


def checkpoint(function: Callable, *args) -> Any:
    """Runs `function(*args)` saving only its inputs; backward runs it again (reentrant)."""
    return _run(function, args, use_reentrant=True)


def non_reentrant_checkpoint(function: Callable, *args) -> Any:
    """As `checkpoint`, by torch's non-reentrant mechanism (saved-tensor hooks): works when
    no input requires grad and with `torch.autograd.grad`."""
    return _run(function, args, use_reentrant=False)


__all__ = [
    "CheckpointingConfigError",
    "CudaRNGStatesTracker",
    "checkpoint",
    "configure",
    "get_cuda_rng_tracker",
    "is_configured",
    "model_parallel_cuda_manual_seed",
    "non_reentrant_checkpoint",
    "reset",
    "settings",
]
