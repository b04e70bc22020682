"""`zerostream config check`: a ds_config's keys and values (config.validate), and then what
initialize() builds from it, built the same way (one code path: a config the check passes is
one initialize accepts, and a refusal is worded the same). Used by the CLI and the estimator's
config writer; above config/ and optim_factory.py, which know nothing of it."""

from __future__ import annotations

import warnings
from typing import Any, List, Tuple

from .config import DeepSpeedConfig, build_config, validate

_BUILT_SECTIONS = ("optimizer", "scheduler")


def check(config: Any, **context) -> dict:
    """Checks without raising: config.validate's {"ok", "errors", "warnings", "notes",
    "tree", "resolved"} for `config` and what the run knows (`context`: validate's keywords,
    world_size, micro_batch_size and the rest), with the optimizer's and scheduler's own
    refusals added when the keys are valid. Sections with "auto" values are left to the run
    that fills them (Hugging Face Trainer fills total_num_steps)."""
    result = validate(config, **context)
    if not result["ok"]:
        return result
    skip = tuple(
        section
        for section in _BUILT_SECTIONS
        if any(
            path.startswith(section + ".") and entry["source"] == "auto"
            for path, entry in result["resolved"].items()
        )
    )
    errors, warns = dry_build(build_config(result["tree"]), skip)
    result["errors"] = list(result["errors"]) + errors
    result["warnings"] = list(result["warnings"]) + warns
    result["ok"] = not result["errors"]
    return result


def dry_build(cfg: DeepSpeedConfig, skip: Tuple[str, ...] = ()) -> Tuple[List[str], List[str]]:
    """Builds the config's optimizer over one dummy parameter and its LR scheduler over that
    optimizer, exactly as initialize() will, and returns (errors, warnings) naming the section
    ('optimizer (AdamW): ...', 'scheduler (WarmupLR): ...'): Adam betas of 1.5,
    warmup_num_steps 0, a bad StepLR argument. Sections in `skip` (their values are "auto",
    filled by the run) are not built. An optimizer zerostream does not implement is a warning:
    initialize() refuses it only when no client optimizer replaces it."""
    if cfg.optimizer is None or "optimizer" in skip:
        return [], []  # nothing to build: no torch (a config without one checks in 0.2 s)
    import torch

    from .lr_schedules import build_scheduler
    from .optim_factory import optimizer_maker

    groups = [{"params": [torch.nn.Parameter(torch.zeros(1))]}]
    try:
        opt = optimizer_maker(None, cfg, groups)(groups)
    except NotImplementedError as exc:
        return [], [f"optimizer ({cfg.optimizer.type}): {exc}"]
    except (ValueError, TypeError) as exc:
        return [f"optimizer ({cfg.optimizer.type}): {exc}"], []
    sched = cfg.scheduler
    if sched is None or "scheduler" in skip:
        return [], []
    try:  # one step too: torch's schedulers check some arguments only when they step
        with warnings.catch_warnings():  # "scheduler.step() before optimizer.step()"
            warnings.simplefilter("ignore", UserWarning)
            build_scheduler(sched.type, opt, dict(sched.params)).step()
    except (ValueError, TypeError, NotImplementedError) as exc:
        return [f"scheduler ({sched.type}): {exc}"], []
    return [], []
