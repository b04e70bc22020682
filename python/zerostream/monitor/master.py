"""MonitorMaster: the enabled writers of a config's monitor sections, built on rank 0 (each
checks its package on every rank first), and one `write_events` that feeds them all."""

from __future__ import annotations

from typing import Iterable

from .base import Event, Monitor, writes_here
from .comet import CometMonitor
from .csv_monitor import CsvMonitor
from .tensorboard import TensorBoardMonitor
from .wandb import WandbMonitor


class MonitorMaster(Monitor):
    """`monitor_config`: zerostream's `config.monitor_config` (or any object with the
    `tensorboard`, `wandb`, `csv_monitor` and `comet` sections and `enabled`)."""

    def __init__(self, monitor_config):
        super().__init__(monitor_config)
        self.enabled = monitor_config.enabled
        self.tb_monitor = None
        self.wandb_monitor = None
        self.csv_monitor = None
        self.comet_monitor = None
        if monitor_config.tensorboard.enabled:
            self.tb_monitor = TensorBoardMonitor(monitor_config.tensorboard)
        if monitor_config.wandb.enabled:
            self.wandb_monitor = WandbMonitor(monitor_config.wandb)
        if monitor_config.csv_monitor.enabled:
            self.csv_monitor = CsvMonitor(monitor_config.csv_monitor)
        if monitor_config.comet.enabled:
            self.comet_monitor = CometMonitor(monitor_config.comet)

    def writers(self) -> list:
        return [
            w
            for w in (self.tb_monitor, self.wandb_monitor, self.csv_monitor, self.comet_monitor)
            if w is not None
        ]

    def write_events(self, event_list: Iterable[Event]) -> None:
        if not writes_here():
            return
        events = list(event_list)
        for writer in self.writers():
            writer.write_events(events)

    def close(self) -> None:
        """Flushes and closes the TensorBoard file (the CSV files are closed after each
        write; wandb and comet runs are the caller's to finish)."""
        if self.tb_monitor is not None:
            self.tb_monitor.close()
