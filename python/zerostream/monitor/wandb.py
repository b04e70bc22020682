"""`wandb` section: each event is `wandb.log({name: value}, step=samples)` in a run started
with `wandb.init(project=project, group=group, entity=team)` on rank 0 (DeepSpeed's calls).
The package is needed only when the section is enabled (DeepSpeed imports it regardless);
offline runs are wandb's own setting (`WANDB_MODE=offline`)."""

from __future__ import annotations

from typing import Iterable

from .base import Event, Monitor, require_package, writes_here


class WandbMonitor(Monitor):
    def __init__(self, wandb_config):
        super().__init__(wandb_config)
        self.enabled = wandb_config.enabled
        self.group = wandb_config.group
        self.team = wandb_config.team
        self.project = wandb_config.project
        self._wandb = None
        if self.enabled:
            wandb = require_package("wandb", "wandb", "wandb.enabled", "Weights & Biases runs")
            if writes_here():
                wandb.init(project=self.project, group=self.group, entity=self.team)
                self._wandb = wandb

    def log(self, data, step=None, commit=None):
        if self._wandb is not None:
            return self._wandb.log(data, step=step, commit=commit)
        return None

    def write_events(self, event_list: Iterable[Event]) -> None:
        for name, value, samples in event_list:
            self.log({name: value}, step=samples)
