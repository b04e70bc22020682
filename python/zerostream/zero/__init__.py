"""`zerostream.zero`: the ZeRO API DeepSpeed scripts import (`deepspeed.zero.*`).

Stage 3 (parameter partitioning) is a later piece of work: until it lands, `Init` is a no-op
when disabled (as HF Transformers uses it outside stage 3) and raises a clear
NotImplementedError when enabled, and `GatheredParameters` is the no-op DeepSpeed defines for
parameters that are not ZeRO-3 partitioned (all of them, here).
"""

from __future__ import annotations

import contextlib
import enum

import torch


class ZeroParamStatus(enum.Enum):
    AVAILABLE = 1
    NOT_AVAILABLE = 2
    INFLIGHT = 3


def _is_zero3_param(p) -> bool:
    return hasattr(p, "ds_id")


class Init(contextlib.ContextDecorator):
    """`with zero.Init(...): model = M()` partitions parameters at creation (ZeRO stage 3)."""

    def __init__(
        self,
        module=None,
        data_parallel_group=None,
        mem_efficient_linear=True,
        remote_device=None,
        pin_memory=False,
        config_dict_or_path=None,
        config=None,
        enabled=True,
        dtype=None,
        mpu=None,
        **kwargs,
    ):
        self.enabled = enabled
        if enabled:
            raise NotImplementedError(
                "zerostream.zero.Init: ZeRO stage 3 parameter partitioning is not implemented "
                "yet in this build; use zero_optimization.stage 0, 1 or 2, or Init(enabled=False)"
            )

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class GatheredParameters(contextlib.ContextDecorator):
    """Gathers ZeRO-3 partitioned params for the context; others are left alone (a no-op when
    none of `params` is partitioned, as in DeepSpeed)."""

    def __init__(self, params, modifier_rank=None, fwd_module=None, enabled=True):
        if isinstance(params, torch.Tensor):
            params = [params]
        self.params = [p for p in (params or []) if _is_zero3_param(p)]
        self.enabled = enabled and bool(self.params)
        if self.enabled:
            raise NotImplementedError(
                "GatheredParameters on ZeRO-3 parameters needs stage 3, "
                "which is not implemented yet in this build"
            )

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def register_external_parameter(module: torch.nn.Module, parameter: torch.nn.Parameter) -> None:
    """Declares that `module` uses `parameter` owned elsewhere; only stage 3 needs to know."""
    if not isinstance(parameter, torch.nn.Parameter):
        raise RuntimeError("register_external_parameter: parameter must be a torch.nn.Parameter")
    external = module.__dict__.setdefault("_zs_external_params", {})
    external[id(parameter)] = parameter


def unregister_external_parameter(module: torch.nn.Module, parameter: torch.nn.Parameter) -> None:
    if not isinstance(parameter, torch.nn.Parameter):
        raise RuntimeError("unregister_external_parameter: parameter must be a torch.nn.Parameter")
    module.__dict__.get("_zs_external_params", {}).pop(id(parameter), None)
