"""`deepspeed.runtime.lr_schedules`: zerostream's implementations of DeepSpeed's schedules
(zerostream/lr_schedules.py), same names, parameters and checkpoint state."""

from zerostream.lr_schedules import (
    LR_RANGE_TEST,
    ONE_CYCLE,
    VALID_LR_SCHEDULES,
    WARMUP_COSINE_LR,
    WARMUP_DECAY_LR,
    WARMUP_LINEAR_RATE,
    WARMUP_LOG_RATE,
    WARMUP_LR,
    LRRangeTest,
    OneCycle,
    WarmupCosineLR,
    WarmupDecayLR,
    WarmupLR,
    get_torch_optimizer,
)

__all__ = [
    "LR_RANGE_TEST",
    "ONE_CYCLE",
    "VALID_LR_SCHEDULES",
    "WARMUP_COSINE_LR",
    "WARMUP_DECAY_LR",
    "WARMUP_LINEAR_RATE",
    "WARMUP_LOG_RATE",
    "WARMUP_LR",
    "LRRangeTest",
    "OneCycle",
    "WarmupCosineLR",
    "WarmupDecayLR",
    "WarmupLR",
    "get_torch_optimizer",
]
