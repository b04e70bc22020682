"""Training metrics written where the ds_config's `tensorboard`, `csv_monitor`, `wandb` and
`comet` sections say, by rank 0 only (DeepSpeed's monitors, same events and layouts).

`EngineMonitor` is what the engine holds: it turns a finished optimizer step into DeepSpeed's
events (engine_events.py); `MonitorMaster` fans a list of `(name, value, samples)` events out
to the enabled writers."""

from .comet import CometMonitor
from .csv_monitor import CsvMonitor
from .engine_events import EngineMonitor
from .master import Monitor, MonitorMaster
from .tensorboard import TensorBoardMonitor
from .wandb import WandbMonitor

__all__ = [
    "CometMonitor",
    "CsvMonitor",
    "EngineMonitor",
    "Monitor",
    "MonitorMaster",
    "TensorBoardMonitor",
    "WandbMonitor",
]
