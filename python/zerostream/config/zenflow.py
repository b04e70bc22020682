"""The `zero_optimization.zenflow` section (ZenFlow, DeepSpeed's stall-free offload): its keys,
DeepSpeed's defaults and per-key rules, checked once when the config loads.

DeepSpeed's ZenFlowConfig (deepspeed/runtime/zenflow/zenflow_config.py, a pydantic model)
has these keys; its rules, kept here:
- `topk_ratio`, `auto_ratio`, `pt_reserved_cores_perc`: numbers in [0, 1];
- `select_strategy`: "auto", "step" or "epoch";
- `select_interval`, `update_interval`: an integer or "auto" (no other string);
- `full_warm_up_rounds`: an integer; `overlap_step`, `offload`: booleans;
- `steps_per_epoch`: filled in at run time (the length of the training data loader),
  accepted when given;
- an unknown key is an error (DeepSpeed's models forbid extras), and a value "auto" of the
  other keys leaves the default (DeepSpeed's models drop "auto" values).
Rules between keys (select_interval against select_strategy and update_interval) are
DeepSpeed's engine's, checked when the engine is built (zero/zenflow/schedule.py), as
DeepSpeed's config model accepts those combinations.
Beyond DeepSpeed, counts are checked for sign: DeepSpeed divides by update_interval and
takes step numbers modulo select_interval, so 0 or negative values fail there later.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional, Union

_PATH = "zero_optimization.zenflow"

STRATEGIES = ("auto", "step", "epoch")


@dataclass(frozen=True)
class ZenFlowConfig:
    topk_ratio: float = 0.1
    select_strategy: str = "auto"
    select_interval: Union[str, int] = "auto"
    update_interval: Union[str, int] = "auto"
    overlap_step: bool = False
    offload: bool = False
    auto_ratio: float = 0.99
    full_warm_up_rounds: int = 0
    pt_reserved_cores_perc: float = 0.5
    steps_per_epoch: Optional[int] = None


_KEYS = tuple(ZenFlowConfig.__dataclass_fields__)


def _fraction(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{_PATH}.{key}: expected a number in [0, 1]; got {value!r}")
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{_PATH}.{key}: expected a number in [0, 1]; got {value!r}")
    return float(value)


def _count(key: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{_PATH}.{key}: expected an integer; got {value!r}")
    if value < low:
        raise ValueError(f"{_PATH}.{key}: expected an integer >= {low}; got {value}")
    return value


def _interval(key: str, value: Any, low: int) -> Union[str, int]:
    if isinstance(value, str):
        if value != "auto":
            raise ValueError(f'{_PATH}.{key}: expected an integer or "auto"; got {value!r}')
        return value
    return _count(key, value, low)


def _flag(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{_PATH}.{key}: expected true or false; got {value!r}")
    return value


def parse_zenflow(section: Any) -> Optional[ZenFlowConfig]:
    """The section's typed config, None when absent (null); ValueError naming the key."""
    if section is None:
        return None
    if isinstance(section, ZenFlowConfig):
        return section
    if not isinstance(section, Mapping):
        raise ValueError(f"{_PATH}: expected an object (a section of keys); got {section!r}")
    unknown = sorted(k for k in section if k not in _KEYS)
    if unknown:
        raise ValueError(
            f"{_PATH}: unknown key(s) {', '.join(map(repr, unknown))}; the keys are "
            f"{', '.join(_KEYS)}"
        )
    given = {k: v for k, v in section.items() if not (isinstance(v, str) and v == "auto")}
    d = ZenFlowConfig()
    strategy = given.get("select_strategy", d.select_strategy)
    if strategy not in STRATEGIES:
        raise ValueError(
            f"{_PATH}.select_strategy: expected one of {', '.join(map(repr, STRATEGIES))}; "
            f"got {strategy!r}"
        )
    steps_per_epoch = given.get("steps_per_epoch")
    return ZenFlowConfig(
        topk_ratio=_fraction("topk_ratio", given.get("topk_ratio", d.topk_ratio)),
        select_strategy=strategy,
        select_interval=_interval(
            "select_interval", given.get("select_interval", d.select_interval), 0
        ),
        update_interval=_interval(
            "update_interval", given.get("update_interval", d.update_interval), 1
        ),
        overlap_step=_flag("overlap_step", given.get("overlap_step", d.overlap_step)),
        offload=_flag("offload", given.get("offload", d.offload)),
        auto_ratio=_fraction("auto_ratio", given.get("auto_ratio", d.auto_ratio)),
        full_warm_up_rounds=_count(
            "full_warm_up_rounds", given.get("full_warm_up_rounds", d.full_warm_up_rounds), 0
        ),
        pt_reserved_cores_perc=_fraction(
            "pt_reserved_cores_perc", given.get("pt_reserved_cores_perc", d.pt_reserved_cores_perc)
        ),
        steps_per_epoch=None
        if steps_per_epoch is None
        else _count("steps_per_epoch", steps_per_epoch, 1),
    )


def with_steps_per_epoch(cfg, steps: int):
    """`cfg` with zenflow.steps_per_epoch set to `steps` (the training data loader's length,
    which DeepSpeed writes over the config's value); `cfg` itself without a zenflow section."""
    zero = cfg.zero_optimization
    if zero.zenflow is None:
        return cfg
    zenflow = dataclasses.replace(zero.zenflow, steps_per_epoch=steps)
    return dataclasses.replace(cfg, zero_optimization=dataclasses.replace(zero, zenflow=zenflow))
