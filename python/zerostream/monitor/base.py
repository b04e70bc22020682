"""What every writer shares: the event type, rank 0's role and the import of an optional
package named by the config key that needs it."""

from __future__ import annotations

import importlib
from typing import Any, Iterable, Tuple

from .. import comm

# DeepSpeed's event: (name such as "Train/Samples/lr", value, samples seen: the x axis).
Event = Tuple[str, Any, int]


def writes_here() -> bool:
    """Only global rank 0 writes (a process without a process group counts as rank 0)."""
    return comm.get_rank() == 0


def require_package(module: str, pip_name: str, key: str, why: str):
    """Imports `module`, or raises ImportError naming the package and the config key that
    asked for it. Checked on every rank, so that all ranks stop alike, not only the writer."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{key}: true needs the `{pip_name}` package ({why}), which is not installed "
            f"({exc}); install it (pip install {pip_name}) or set {key} to false"
        ) from exc


class Monitor:
    """DeepSpeed's monitor interface: built from its config section, then `write_events`."""

    def __init__(self, monitor_config):
        self.monitor_config = monitor_config

    def write_events(self, event_list: Iterable[Event]) -> None:  # pragma: no cover
        raise NotImplementedError
