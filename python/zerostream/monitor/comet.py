"""`comet` section: an experiment from `comet_ml.start(api_key=, project=, workspace=,
experiment_key=, mode=, online=)` on rank 0, named `experiment_name` when given; each event
name is logged at most once per `samples_log_interval` samples (its first event always), as
DeepSpeed does. Needs comet_ml 3.41 or later (the first with `comet_ml.start`) only when
the section is enabled; `online: false` keeps the experiment in a local offline archive."""

from __future__ import annotations

from typing import Dict, Iterable

from .base import Event, Monitor, require_package, writes_here


class SamplesInterval:
    """Whether an event is due: the first of each name, then one at least `interval` samples
    after the last one logged under that name."""

    def __init__(self, interval: int):
        self.interval = interval
        self._last: Dict[str, int] = {}

    def due(self, name: str, samples: int) -> bool:
        last = self._last.get(name)
        if last is not None and samples - last < self.interval:
            return False
        self._last[name] = samples
        return True


class CometMonitor(Monitor):
    def __init__(self, comet_config):
        super().__init__(comet_config)
        self.enabled = comet_config.enabled
        self._samples_log_interval = comet_config.samples_log_interval
        self._experiment = None
        self._due = SamplesInterval(comet_config.samples_log_interval)
        if not self.enabled:
            return
        comet_ml = require_package("comet_ml", "comet_ml", "comet.enabled", "Comet experiments")
        if not hasattr(comet_ml, "start"):
            raise ImportError(
                f"comet.enabled: true needs comet_ml 3.41 or later (comet_ml.start); "
                f"installed: {getattr(comet_ml, '__version__', 'unknown')}"
            )
        if writes_here():
            self._experiment = comet_ml.start(
                api_key=comet_config.api_key,
                project=comet_config.project,
                workspace=comet_config.workspace,
                experiment_key=comet_config.experiment_key,
                mode=comet_config.mode,
                online=comet_config.online,
            )
            if comet_config.experiment_name is not None:
                self._experiment.set_name(comet_config.experiment_name)

    @property
    def experiment(self):
        return self._experiment

    @property
    def samples_log_interval(self) -> int:
        return self._samples_log_interval

    def write_events(self, event_list: Iterable[Event]) -> None:
        if self._experiment is None:
            return
        for name, value, samples in event_list:
            if self._due.due(name, samples):
                self._experiment.log_metric(name, value, step=samples)
