"""The run's ds_config: `load` (load.py) reads a dict, path or base64 text once through the
native core and returns a DeepSpeedConfig of frozen section objects (sections.py); `validate`
checks without raising. check.py (`zerostream config check`) also builds the optimizer and
scheduler a config names, so it is imported by its callers and not here: loading a config
reaches no optimizer code. Every name below is importable as `zerostream.config.<name>`."""

from .load import (
    MAX_DEPTH,
    ConfigError,
    ReadOnlyMapping,
    build_config,
    config_text,
    load,
    validate,
)
from .sections import (
    EIGENVALUE_DEFAULTS,
    ActivationCheckpointingConfig,
    AioConfig,
    BF16Config,
    CheckpointConfig,
    DataTypesConfig,
    DeepSpeedConfig,
    FlopsProfilerConfig,
    FP16Config,
    MonitorConfig,
    OffloadOptimizerConfig,
    OffloadParamConfig,
    OptimizerConfig,
    ParallelWriteConfig,
    SchedulerConfig,
    WandbConfig,
    ZeroConfig,
    ZeroStreamExtConfig,
    dtype_name,
)

__all__ = [
    "MAX_DEPTH",
    "ConfigError",
    "ReadOnlyMapping",
    "build_config",
    "config_text",
    "load",
    "validate",
    "EIGENVALUE_DEFAULTS",
    "ActivationCheckpointingConfig",
    "AioConfig",
    "BF16Config",
    "CheckpointConfig",
    "DataTypesConfig",
    "DeepSpeedConfig",
    "FlopsProfilerConfig",
    "FP16Config",
    "MonitorConfig",
    "OffloadOptimizerConfig",
    "OffloadParamConfig",
    "OptimizerConfig",
    "ParallelWriteConfig",
    "SchedulerConfig",
    "WandbConfig",
    "ZeroConfig",
    "ZeroStreamExtConfig",
    "dtype_name",
]
