"""The `elasticity` section: DeepSpeed's elastic batch sizes. From the largest acceptable
train batch and the micro-batch sizes a job may use, pick one train batch size that as many
GPU counts as possible divide into whole micro-batches (with gradient accumulation making
up the rest), so the job keeps its batch size, and its convergence, when a scheduler
scales it between `min_gpus` and `max_gpus`.

Version 0.1: the candidates are each micro-batch size, and their least common multiple,
scaled by the largest highly composite number that keeps them within the maximum (highly
composite numbers have more divisors than any smaller number); the candidate that the most
GPU counts in range divide wins, ties going to the larger batch (`prefer_larger_batch`,
else the smaller). A GPU count is valid for a batch when it divides batch / m for some
micro-batch size m. Version 0.2 counts whole nodes (`num_gpus_per_node`) of data-parallel
groups (`model_parallel_size`) and, for a world size outside the valid list, fits the batch
to the current data-parallel size instead.

At config load (`config.load`), an enabled section sets train_batch_size,
train_micro_batch_size_per_gpu and gradient_accumulation_steps for the run's world size;
batch keys written beside it are an error unless `ignore_non_elastic_batch_info`."""

from __future__ import annotations

import json
import logging
import math
import os
from functools import reduce
from typing import List, Optional, Tuple

logger = logging.getLogger("zerostream")

LATEST_VERSION = 0.2
MINIMUM_DEEPSPEED_VERSION = "0.3.8"  # DeepSpeed's first release with elasticity
SCHEDULER_CONFIG_ENV = "DEEPSPEED_ELASTICITY_CONFIG"  # what the resource scheduler saw
BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")

# The highly composite numbers up to 720720 (each has more divisors than every smaller one).
HCN_LIST = [
    1, 2, 4, 6, 12, 24, 36, 48, 60, 120, 180, 240, 360, 720, 840, 1260, 1680, 2520, 5040, 7560,
    10080, 15120, 20160, 25200, 27720, 45360, 50400, 55440, 83160, 110880, 166320, 221760,
    277200, 332640, 498960, 554400, 665280, 720720,
]  # fmt: skip

DEFAULTS = {
    "enabled": False,
    "max_train_batch_size": 2000,
    "micro_batch_sizes": [2, 4, 6],
    "min_gpus": 1,
    "max_gpus": 10000,
    "min_time": 0,
    "version": LATEST_VERSION,
    "prefer_larger_batch": True,
    "ignore_non_elastic_batch_info": False,
    "model_parallel_size": 1,
    "num_gpus_per_node": 1,
}


class ElasticityError(ValueError):
    """Any elasticity error (a ValueError: they are about the config or the world size)."""


class ElasticityConfigError(ElasticityError):
    """The `elasticity` section is missing, disabled or invalid."""


class ElasticityIncompatibleWorldSize(ElasticityError):
    """The world size is not one of the config's valid GPU counts."""


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class ElasticityConfig:
    """The validated `elasticity` section; DeepSpeed's attribute names."""

    def __init__(self, param_dict: dict):
        unknown = sorted(set(param_dict) - set(DEFAULTS))
        if unknown:
            logger.warning(
                "elasticity: unknown keys %s, ignored (known: %s)", unknown, sorted(DEFAULTS)
            )
        get = lambda key: param_dict.get(key, DEFAULTS[key])  # noqa: E731
        self.enabled = bool(get("enabled"))
        if self.enabled:
            for key in ("max_train_batch_size", "micro_batch_sizes"):
                if key not in param_dict:
                    raise ElasticityConfigError(f"elasticity.{key}: required when enabled")
        self.max_acceptable_batch_size = get("max_train_batch_size")
        if not _is_int(self.max_acceptable_batch_size) or self.max_acceptable_batch_size < 1:
            raise ElasticityConfigError(
                f"elasticity.max_train_batch_size: expected a positive integer; got "
                f"{self.max_acceptable_batch_size!r}"
            )
        self.micro_batches = get("micro_batch_sizes")
        if (
            not isinstance(self.micro_batches, list)
            or not self.micro_batches
            or not all(_is_int(m) and m > 0 for m in self.micro_batches)
        ):
            raise ElasticityConfigError(
                f"elasticity.micro_batch_sizes: expected a list of positive integers; got "
                f"{self.micro_batches!r}"
            )
        self.min_gpus, self.max_gpus = get("min_gpus"), get("max_gpus")
        for key, value in (("min_gpus", self.min_gpus), ("max_gpus", self.max_gpus)):
            if not _is_int(value) or value < 1:
                raise ElasticityConfigError(f"elasticity.{key}: must be >= 1; got {value!r}")
        if self.max_gpus < self.min_gpus:
            raise ElasticityConfigError(
                f"elasticity.min_gpus: {self.min_gpus} is greater than max_gpus {self.max_gpus}"
            )
        self.model_parallel_size = get("model_parallel_size")
        self.num_gpus_per_node = get("num_gpus_per_node")
        for key, value in (
            ("model_parallel_size", self.model_parallel_size),
            ("num_gpus_per_node", self.num_gpus_per_node),
        ):
            if not _is_int(value) or value < 1:
                raise ElasticityConfigError(f"elasticity.{key}: must be >= 1; got {value!r}")
        self.min_time = get("min_time")
        if not isinstance(self.min_time, (int, float)) or self.min_time < 0:
            raise ElasticityConfigError(f"elasticity.min_time: must be >= 0; got {self.min_time!r}")
        self.version = get("version")
        try:
            float(self.version)
        except (TypeError, ValueError):
            raise ElasticityConfigError(
                f"elasticity.version: expected 0.1 or 0.2; got {self.version!r}"
            ) from None
        self.prefer_larger_batch_size = bool(get("prefer_larger_batch"))
        self.ignore_non_elastic_batch_info = bool(get("ignore_non_elastic_batch_info"))

    def __repr__(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True, indent=4)


# --- version 0.1 ------------------------------------------------------------------------------


def _largest_hcn_at_most(value: int) -> int:
    return max((h for h in HCN_LIST if h <= value), default=1)


def get_candidate_batch_sizes(bases: List[int], max_batch: int) -> List[int]:
    """Each base within `max_batch` scaled by the largest highly composite number keeping it
    there (a base equal to the maximum stays as it is)."""
    found = {
        b if b == max_batch else b * _largest_hcn_at_most(max_batch // b)
        for b in bases
        if b <= max_batch
    }
    return sorted(found)


def get_valid_gpus(batch: int, micro_batches: List[int], min_gpus: int, max_gpus: int) -> List[int]:
    """The GPU counts in [min_gpus, max_gpus] dividing batch / m for some micro-batch m."""
    valid = set()
    for m in micro_batches:
        if batch % m:
            continue
        most = batch // m
        valid.update(g for g in range(min_gpus, min(most, max_gpus) + 1) if most % g == 0)
    return sorted(valid)


def get_best_candidates(candidates, micro_batches, min_gpus, max_gpus, prefer_larger):
    """(batch, its valid GPU counts): the most counts, ties to the larger (or smaller) batch;
    (the smallest micro-batch, None) when no candidate has any."""
    best: Tuple[int, Optional[List[int]]] = (min(micro_batches), None)
    best_key = (0, 0)
    for batch in candidates:
        gpus = get_valid_gpus(batch, micro_batches, min_gpus, max_gpus)
        key = (len(gpus), batch if prefer_larger else -batch)
        if gpus and key > best_key:
            best, best_key = (batch, gpus), key
    return best


def _compatible_gpus_v01(
    micro_batches, max_batch, min_gpus=None, max_gpus=None, prefer_larger=True
):
    min_gpus = min_gpus or 1
    max_gpus = max_gpus or max_batch // min(micro_batches)
    if any(m > max_batch for m in micro_batches):
        raise ElasticityConfigError(
            f"elasticity.micro_batch_sizes: every micro-batch size must be at most "
            f"max_train_batch_size {max_batch}; got {micro_batches}"
        )
    lcm = reduce(lambda a, b: a * b // math.gcd(a, b), micro_batches)
    candidates = get_candidate_batch_sizes(list(micro_batches) + [lcm], max_batch)
    return get_best_candidates(candidates, micro_batches, min_gpus, max_gpus, prefer_larger)


# --- version 0.2 ------------------------------------------------------------------------------


def _compatible_gpus_v02(cfg: ElasticityConfig, current_gpus: int):
    """(batch, valid data-parallel sizes, micro-batch for `current_gpus`)."""
    per_node, mp = cfg.num_gpus_per_node, cfg.model_parallel_size
    if per_node % mp != 0:
        raise ElasticityConfigError(
            f"elasticity.num_gpus_per_node: {per_node} must be divisible by "
            f"model_parallel_size {mp} (elasticity version 0.2 counts whole nodes)"
        )
    micro, prefer_larger = cfg.micro_batches, cfg.prefer_larger_batch_size

    def micro_for(batch) -> Optional[int]:
        fits = [m for m in micro if batch // current_gpus % m == 0]
        if not fits:
            return None
        return max(fits) if prefer_larger else fits[0]

    dp_per_node = per_node // mp
    batch, nodes = _compatible_gpus_v01(
        micro,
        int(cfg.max_acceptable_batch_size / dp_per_node),
        int(cfg.min_gpus / per_node),
        int(cfg.max_gpus / per_node),
        prefer_larger=prefer_larger,
    )
    batch = int(batch) * dp_per_node
    valid = [n * dp_per_node for n in (nodes or [])]
    if current_gpus // mp in valid:
        return batch, valid, micro_for(batch)
    # Not a valid size: the largest (smallest) multiple of one step at this size that fits.
    dp = (current_gpus / per_node) * dp_per_node
    sizes = [math.floor(cfg.max_acceptable_batch_size / (m * dp)) * m * dp for m in micro]
    batch = max(sizes) if prefer_larger else min(sizes)
    return batch, [int(dp)], micro_for(batch)


# --- DeepSpeed's API --------------------------------------------------------------------------


def elasticity_enabled(ds_config: dict) -> bool:
    section = ds_config.get("elasticity")
    return isinstance(section, dict) and bool(section.get("enabled", False))


def _largest_micro(micro_batches, batch: int, world: int) -> int:
    for m in sorted(set(micro_batches), reverse=True):
        if batch // world % m == 0:
            return m
    raise ElasticityError(
        f"elasticity: no micro-batch size in {micro_batches} divides the batch per rank "
        f"{batch} // {world}"
    )


def compute_elastic_config(
    ds_config: dict, target_deepspeed_version: str, world_size: int = 0, return_microbatch=False
):
    """(train batch size, valid GPU counts), and the micro-batch size when `world_size` is
    given (checked against the valid counts) or `return_microbatch`."""
    from packaging import version as pkg_version

    if not isinstance(ds_config, dict):
        raise ValueError(
            f"compute_elastic_config: expected a ds_config dict; got {type(ds_config)}"
        )
    if "elasticity" not in ds_config:
        raise ElasticityConfigError("elasticity: the section is missing from the config")
    section = ds_config["elasticity"]
    if not isinstance(section, dict) or not section.get("enabled", False):
        raise ElasticityConfigError("elasticity.enabled: elasticity is disabled; set it true")
    cfg = ElasticityConfig(section)
    version = float(cfg.version)
    if cfg.model_parallel_size > 1 and version != 0.2:
        raise ElasticityConfigError(
            f"elasticity.model_parallel_size: {cfg.model_parallel_size} needs version 0.2; "
            f"version {cfg.version} has no model parallelism"
        )
    if version > LATEST_VERSION:
        raise ElasticityConfigError(
            f"elasticity.version: {cfg.version} is newer than the latest supported, "
            f"{LATEST_VERSION}"
        )
    # A scheduler asks for the DeepSpeed version it will start; the runtime (resolve_batch)
    # passes None: itself.
    minimum = pkg_version.parse(MINIMUM_DEEPSPEED_VERSION)
    if (
        target_deepspeed_version is not None
        and pkg_version.parse(str(target_deepspeed_version)) < minimum
    ):
        raise ElasticityError(
            f"compute_elastic_config: target DeepSpeed version {target_deepspeed_version} is "
            f"older than {MINIMUM_DEEPSPEED_VERSION}, the first with elasticity"
        )
    micro = None
    if version == 0.1:
        batch, valid = _compatible_gpus_v01(
            cfg.micro_batches, cfg.max_acceptable_batch_size, cfg.min_gpus, cfg.max_gpus,
            cfg.prefer_larger_batch_size,
        )  # fmt: skip
    elif version == 0.2:
        current = world_size or _world_from_env()
        batch, valid, micro = _compatible_gpus_v02(cfg, current)
    else:
        raise ElasticityConfigError(f"elasticity.version: expected 0.1 or 0.2; got {cfg.version}")
    batch = int(batch)
    valid = valid or []
    if world_size > 0:
        if world_size not in valid:
            raise ElasticityIncompatibleWorldSize(
                f"elasticity: world size {world_size} is not one of the valid GPU counts {valid}"
            )
        return batch, valid, _largest_micro(cfg.micro_batches, batch, world_size)
    if return_microbatch:
        if micro is None:
            micro = _largest_micro(cfg.micro_batches, batch, 1)
        return batch, valid, micro
    return batch, valid


def _world_from_env() -> int:
    value = os.environ.get("WORLD_SIZE", "")
    if not value.isnumeric():
        raise ElasticityConfigError(
            f"elasticity.version 0.2 needs the world size: pass world_size or set WORLD_SIZE "
            f"(WORLD_SIZE={value!r})"
        )
    return int(value)


def ensure_immutable_elastic_config(runtime_elastic_config_dict: dict) -> None:
    """Refuses a run whose section differs from what the resource scheduler saw
    (DEEPSPEED_ELASTICITY_CONFIG) in the maximum batch, the micro-batch sizes or the
    version."""
    seen = os.environ.get(SCHEDULER_CONFIG_ENV)
    if seen is None:
        logger.warning(
            "elasticity: %s is not set; cannot check that the scheduler scales this job to "
            "valid GPU counts", SCHEDULER_CONFIG_ENV,
        )  # fmt: skip
        return
    scheduler = json.loads(seen)
    scheduler = ElasticityConfig(scheduler.get("elasticity", scheduler))
    runtime = ElasticityConfig(runtime_elastic_config_dict)
    for attr, key in (
        ("max_acceptable_batch_size", "max_train_batch_size"),
        ("micro_batches", "micro_batch_sizes"),
        ("version", "version"),
    ):
        if getattr(runtime, attr) != getattr(scheduler, attr):
            raise ElasticityConfigError(
                f"elasticity.{key}: the resource scheduler saw {getattr(scheduler, attr)!r} "
                f"({SCHEDULER_CONFIG_ENV}), the run has {getattr(runtime, attr)!r}"
            )


def resolve_batch(ds_config: dict, world_size: int) -> Optional[dict]:
    """The config with the elastic batch keys for `world_size` ranks, or None when
    elasticity is not enabled (config.load calls it before the batch rule)."""
    if not elasticity_enabled(ds_config):
        return None
    section = ds_config["elasticity"]
    batch, _, micro = compute_elastic_config(ds_config, None, world_size=world_size)
    ensure_immutable_elastic_config(section)
    given = [k for k in BATCH_KEYS if k in ds_config]
    if given and not section.get("ignore_non_elastic_batch_info", False):
        raise ElasticityConfigError(
            f"elasticity: {', '.join(given)} given beside an enabled elasticity section, which "
            f"sets them; remove them, or set elasticity.ignore_non_elastic_batch_info true to "
            f"have them replaced"
        )
    resolved = dict(ds_config)
    resolved.update(
        train_batch_size=batch,
        train_micro_batch_size_per_gpu=micro,
        gradient_accumulation_steps=batch // (micro * world_size),
    )
    for key in given:
        logger.warning("elasticity: %s %s replaced by %s", key, ds_config[key], resolved[key])
    return resolved
