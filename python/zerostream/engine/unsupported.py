"""DeepSpeed features zerostream does not implement, refused at initialize() with an error
naming the feature, instead of training something else than the user asked for or failing
deep inside a step.

The config-side list matches the one csrc/config/rules.cpp warns about ("initialize()
raises NotImplementedError while it is set"), and ZenFlow's settings it does not run with
(zero/zenflow/support.py); the model-side check finds expert parameters of DeepSpeed's MoE
layers (zerostream/moe/).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Iterable, List, Optional

import torch

from ..config import DeepSpeedConfig, dtype_name
from ..moe.layer import EXPERT_PARALLELISM
from ..moe.utils import is_moe_param, is_moe_param_group
from ..zero.zenflow.support import zenflow_refusals


def _config_features(cfg: DeepSpeedConfig) -> List[str]:
    """'<key path>: <feature>' for every unsupported feature the config turns on."""
    z = cfg.zero_optimization
    zp = "zero_optimization."
    found = []
    if z.zero_quantized_weights:
        found.append(f"{zp}zero_quantized_weights: ZeRO++ quantized weights (qwZ)")
    if z.zero_quantized_nontrainable_weights:
        found.append(f"{zp}zero_quantized_nontrainable_weights: ZeRO++ quantized frozen weights")
    if z.zero_quantized_gradients:
        found.append(f"{zp}zero_quantized_gradients: ZeRO++ quantized gradients (qgZ)")
    if z.zero_hpz_partition_size > 1:
        found.append(
            f"{zp}zero_hpz_partition_size={z.zero_hpz_partition_size}: ZeRO++ hierarchical "
            "weight partitioning (hpZ)"
        )
    if z.mics_shard_size > 0:
        found.append(f"{zp}mics_shard_size={z.mics_shard_size}: MiCS sharding")
    found += zenflow_refusals(cfg)
    if z.offload_optimizer is not None and z.offload_optimizer.super_offload:
        found.append(f"{zp}offload_optimizer.super_offload: SuperOffload")
    accum = dtype_name(cfg.data_types.grad_accum_dtype)
    if z.stage == 0 and accum is not None and accum != cfg.precision:
        found.append(
            f"data_types.grad_accum_dtype={cfg.data_types.grad_accum_dtype}: accumulating "
            f"gradients in {accum} with the model in {cfg.precision} at ZeRO stage 0 (it adds "
            f"them up in param.grad, in the model's dtype; DeepSpeed refuses it too; stages "
            f"1-3 accumulate in {accum})"
        )
    compile_section = cfg.raw.get("compile")
    if isinstance(compile_section, Mapping) and compile_section.get("deepcompile") is True:
        found.append("compile.deepcompile: DeepCompile (compiler-driven ZeRO)")
    return found


def _expert_params(model: torch.nn.Module, groups: Iterable[dict]) -> Optional[str]:
    """A description of the first expert parameter or MoE param group, else None."""
    for name, p in model.named_parameters():
        if is_moe_param(p):
            return f"parameter {name} is an expert's (allreduce=False)"
    for i, g in enumerate(groups):
        if is_moe_param_group(g):
            return f"param group {i} ({g.get('name', 'unnamed')!r}) is an MoE group (moe=True)"
    return None


def refuse_unsupported(cfg: DeepSpeedConfig, model: torch.nn.Module, groups: List[dict]) -> None:
    """Raises NotImplementedError naming every unsupported feature the run asks for."""
    problems = _config_features(cfg)
    expert = _expert_params(model, groups)
    if expert is not None:
        problems.append(f"{EXPERT_PARALLELISM}: {expert}")
    if problems:
        raise NotImplementedError(
            "zerostream does not implement these DeepSpeed features: "
            + "; ".join(problems)
            + ". Remove them from the config/model, or run this job with DeepSpeed."
        )
