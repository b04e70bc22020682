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

# The schedules' parameter names, under DeepSpeed's constant names (scripts and DeepSpeed's
# tests build `scheduler.params` with them).
LR_SCHEDULE = "lr_schedule"
LR_RANGE_TEST_MIN_LR = "lr_range_test_min_lr"
LR_RANGE_TEST_STEP_RATE = "lr_range_test_step_rate"
LR_RANGE_TEST_STEP_SIZE = "lr_range_test_step_size"
LR_RANGE_TEST_STAIRCASE = "lr_range_test_staircase"
EDGE_VALUE = "edge_value"
MID_VALUE = "mid_value"
CYCLE_FIRST_STEP_SIZE = "cycle_first_step_size"
CYCLE_FIRST_STAIR_COUNT = "cycle_first_stair_count"
CYCLE_SECOND_STEP_SIZE = "cycle_second_step_size"
CYCLE_SECOND_STAIR_COUNT = "cycle_second_stair_count"
DECAY_STEP_SIZE = "decay_step_size"
CYCLE_MIN_LR = "cycle_min_lr"
CYCLE_MAX_LR = "cycle_max_lr"
DECAY_LR_RATE = "decay_lr_rate"
CYCLE_MIN_MOM = "cycle_min_mom"
CYCLE_MAX_MOM = "cycle_max_mom"
DECAY_MOM_RATE = "decay_mom_rate"
WARMUP_MIN_LR = "warmup_min_lr"
WARMUP_MAX_LR = "warmup_max_lr"
WARMUP_NUM_STEPS = "warmup_num_steps"
WARMUP_TYPE = "warmup_type"
WARMUP_MIN_RATIO = "warmup_min_ratio"
COS_MIN_RATIO = "cos_min_ratio"
TOTAL_NUM_STEPS = "total_num_steps"

__all__ = [
    "LR_SCHEDULE",
    "LR_RANGE_TEST_MIN_LR",
    "LR_RANGE_TEST_STEP_RATE",
    "LR_RANGE_TEST_STEP_SIZE",
    "LR_RANGE_TEST_STAIRCASE",
    "EDGE_VALUE",
    "MID_VALUE",
    "CYCLE_FIRST_STEP_SIZE",
    "CYCLE_FIRST_STAIR_COUNT",
    "CYCLE_SECOND_STEP_SIZE",
    "CYCLE_SECOND_STAIR_COUNT",
    "DECAY_STEP_SIZE",
    "CYCLE_MIN_LR",
    "CYCLE_MAX_LR",
    "DECAY_LR_RATE",
    "CYCLE_MIN_MOM",
    "CYCLE_MAX_MOM",
    "DECAY_MOM_RATE",
    "WARMUP_MIN_LR",
    "WARMUP_MAX_LR",
    "WARMUP_NUM_STEPS",
    "WARMUP_TYPE",
    "WARMUP_MIN_RATIO",
    "COS_MIN_RATIO",
    "TOTAL_NUM_STEPS",
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
