"""DeepSpeed's MoE param-group helpers (`deepspeed.moe.utils`).

An expert parameter is one a DeepSpeed MoE layer marked with `allreduce = False` (its
gradient is reduced over the expert-data-parallel group, named by `param.group_name`, not
over all ranks). zerostream's MoE layer refuses to be built, so on zerostream these helpers
find no expert parameters unless a model marked some itself; initialize() then refuses the
run (zerostream/engine/unsupported.py). Without expert parameters the helpers return the groups
they were given, which is what scripts that call them unconditionally need.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple, Union

import torch

from .layer import MoE

ParamGroups = Union[Dict[str, Any], Sequence[Dict[str, Any]]]

# DeepSpeed's default cap on the elements of one expert param group (about 2**27.4).
DEFAULT_MAX_GROUP_SIZE = 178956971


def is_moe_param(param: torch.Tensor) -> bool:
    """True for a parameter marked as an expert's (`allreduce` present and false)."""
    return getattr(param, "allreduce", True) is False


def is_moe_param_group(param_group: Dict[str, Any]) -> bool:
    return bool(param_group.get("moe", False))


def has_moe_layers(module: torch.nn.Module) -> Tuple[bool, int]:
    """(whether `module` holds a DeepSpeed MoE layer, the first one's expert count)."""
    for m in module.modules():
        if isinstance(m, MoE):
            return True, getattr(m, "num_experts", 0)
    return False, 0


def split_params_into_shared_and_expert_params(
    params: Sequence[torch.nn.Parameter],
) -> Tuple[List[torch.nn.Parameter], List[torch.nn.Parameter]]:
    shared = [p for p in params if not is_moe_param(p)]
    experts = [p for p in params if is_moe_param(p)]
    return shared, experts


def _as_group_list(param_groups: ParamGroups) -> List[Dict[str, Any]]:
    if isinstance(param_groups, dict):
        return [param_groups]
    if isinstance(param_groups, (list, tuple)):
        return list(param_groups)
    raise ValueError(
        "split_params_into_different_moe_groups_for_optimizer: expected a param group dict "
        f"or a list/tuple of them; got {type(param_groups).__name__}"
    )


def _chunks(params: List[torch.nn.Parameter], max_elements) -> List[List[torch.nn.Parameter]]:
    """Consecutive runs of `params` of at most `max_elements` elements (a larger parameter
    gets a run of its own)."""
    if max_elements is None:
        return [params] if params else []
    runs: List[List[torch.nn.Parameter]] = []
    size = 0
    for p in params:
        if not runs or size + p.numel() > max_elements:
            runs.append([])
            size = 0
        runs[-1].append(p)
        size += p.numel()
    return runs


def split_params_into_different_moe_groups_for_optimizer(
    param_groups: ParamGroups, max_group_size=DEFAULT_MAX_GROUP_SIZE
) -> List[Dict[str, Any]]:
    """Moves expert parameters out of each group into groups of their own, one per
    (source group, expert group name), with the source's options plus `moe: True` and
    `name: <expert group name>`, cut into runs of at most `max_group_size` elements.
    The source groups are edited in place (their `params` lose the experts) and returned
    first, as DeepSpeed's helper does."""
    groups = _as_group_list(param_groups)
    expert_groups: List[Dict[str, Any]] = []
    for group in groups:
        params = list(group["params"])
        by_name: Dict[str, List[torch.nn.Parameter]] = {}
        for p in params:
            if is_moe_param(p):
                by_name.setdefault(getattr(p, "group_name", "experts"), []).append(p)
        if not by_name:
            group["params"] = params
            continue
        group["params"] = [p for p in params if not is_moe_param(p)]
        for name, experts in by_name.items():
            for run in _chunks(experts, max_group_size):
                expert_groups.append({**group, "name": name, "moe": True, "params": run})
    return groups + expert_groups
