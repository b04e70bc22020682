"""`deepspeed.monitor.config`: the monitor sections as DeepSpeed's config classes name them.
Each call validates its keys through zerostream's schema (unknown keys and bad values are
errors naming the key; omitted keys take the schema's defaults) and returns zerostream's
frozen section objects, which isinstance() against these names accepts."""

from __future__ import annotations

from zerostream import config as _config

_SECTIONS = ("tensorboard", "csv_monitor", "wandb", "comet")


def _monitor_config(sections: dict) -> "_config.MonitorConfigs":
    unknown = sorted(set(sections) - set(_SECTIONS))
    if unknown:
        raise ValueError(f"monitor config: unknown sections {unknown}; expected {_SECTIONS}")
    return _config.load(dict(sections), require_batch=False, log=False).monitor_config


def _section_type(name: str, cls: type, doc: str) -> type:
    class _Meta(type):
        def __instancecheck__(self, obj) -> bool:
            return isinstance(obj, cls)

    def new(_cls, **keys):
        return getattr(_monitor_config({name: keys}), name)

    return _Meta(cls.__name__ if name != "csv_monitor" else "CSVConfig", (), {
        "__new__": new, "__doc__": doc, "__module__": __name__,
    })  # fmt: skip


TensorBoardConfig = _section_type(
    "tensorboard", _config.MonitorConfig, "`tensorboard`: enabled, output_path, job_name."
)
CSVConfig = _section_type(
    "csv_monitor", _config.MonitorConfig, "`csv_monitor`: enabled, output_path, job_name."
)
WandbConfig = _section_type("wandb", _config.WandbConfig, "`wandb`: enabled, group, team, project.")
CometConfig = _section_type(
    "comet",
    _config.CometConfig,
    "`comet`: enabled, samples_log_interval, project, workspace, api_key, experiment_name, "
    "experiment_key, online, mode.",
)


class _MonitorConfigType(type):
    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, _config.MonitorConfigs)


class DeepSpeedMonitorConfig(metaclass=_MonitorConfigType):
    """`DeepSpeedMonitorConfig(tensorboard={...}, wandb={...}, csv_monitor={...},
    comet={...})`; every section optional."""

    def __new__(cls, **sections):
        return _monitor_config(sections)


def get_monitor_config(param_dict: dict) -> "_config.MonitorConfigs":
    """The monitor sections of a whole ds_config dict."""
    return _monitor_config({k: param_dict.get(k, {}) for k in _SECTIONS})


__all__ = [
    "CSVConfig",
    "CometConfig",
    "DeepSpeedMonitorConfig",
    "TensorBoardConfig",
    "WandbConfig",
    "get_monitor_config",
]
