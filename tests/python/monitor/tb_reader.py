"""Reads what the monitors wrote back with independent readers: TensorBoard's own
EventAccumulator and Python's csv module."""

import csv
import pathlib

from prerequisites import missing


def require_tensorboard() -> None:
    """Skips (fails in CI) before anything is trained when TensorBoard is missing."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        missing(
            "the tensorboard package is not installed (pinned in requirements.txt; "
            "scripts/setup.sh installs it)"
        )


def tensorboard_scalars(log_dir) -> dict:
    """{tag: [(step, value), ...]} as TensorBoard itself loads the folder's event files."""
    require_tensorboard()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def csv_rows(path) -> list:
    with open(pathlib.Path(path), newline="") as f:
        return list(csv.reader(f))
