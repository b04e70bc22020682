"""`tensorboard` section: scalars through torch.utils.tensorboard's SummaryWriter into
`<output_path>/<job_name>/` (DeepSpeed's layout; output_path "" is the working directory)."""

from __future__ import annotations

import os
from typing import Iterable

from .base import Event, Monitor, require_package, writes_here


def log_dir_of(section) -> str:
    """`<output_path>/<job_name>`, the folder DeepSpeed's tensorboard and CSV writers use."""
    return os.path.join(section.output_path, section.job_name)


class TensorBoardMonitor(Monitor):
    def __init__(self, tensorboard_config):
        super().__init__(tensorboard_config)
        self.enabled = tensorboard_config.enabled
        self.output_path = tensorboard_config.output_path
        self.job_name = tensorboard_config.job_name
        self.summary_writer = None
        if self.enabled:
            # torch.utils.tensorboard imports the tensorboard package for its protobufs.
            require_package(
                "tensorboard", "tensorboard", "tensorboard.enabled", "TensorBoard event files"
            )
            if writes_here():
                self.get_summary_writer()

    def get_summary_writer(self):
        """The writer (made on first call, on rank 0 with the section enabled), else None."""
        if self.summary_writer is None and self.enabled and writes_here():
            from torch.utils.tensorboard import SummaryWriter

            log_dir = log_dir_of(self)
            os.makedirs(log_dir, exist_ok=True)
            self.summary_writer = SummaryWriter(log_dir=log_dir)
        return self.summary_writer

    def write_events(self, event_list: Iterable[Event], flush: bool = True) -> None:
        if self.summary_writer is None:
            return
        for name, value, samples in event_list:
            self.summary_writer.add_scalar(name, value, samples)
        if flush:
            self.summary_writer.flush()

    def flush(self) -> None:
        if self.summary_writer is not None:
            self.summary_writer.flush()

    def close(self) -> None:
        if self.summary_writer is not None:
            self.summary_writer.close()
            self.summary_writer = None
