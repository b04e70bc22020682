"""The run's ds_config: `load` (load.py) reads a dict, path or base64 text once through the
native core and returns a DeepSpeedConfig of frozen section objects (sections.py); `validate`
checks without raising. Every name below is importable as `zerostream.config.<name>`. The
package reaches no optimizer or I/O code; `zerostream config check`, which also builds the
optimizer and scheduler a config names, is config_check.py above it."""

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
