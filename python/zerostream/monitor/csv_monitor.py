"""`csv_monitor` section: one CSV file per event name in `<output_path>/<job_name>/`, as
DeepSpeed writes them: "Train/Samples/lr" goes to `Train_Samples_lr.csv` (slashes and spaces
become underscores), whose first row is `step,<last part of the name>` and each further row
`<samples seen>,<value>`. Files are appended to, as DeepSpeed's are: a resumed run with the
same job name goes on in the same files."""

from __future__ import annotations

import csv
import os
from typing import Iterable, Set

from .base import Event, Monitor, writes_here
from .tensorboard import log_dir_of


def csv_file_name(event_name: str) -> str:
    return event_name.replace("/", "_").replace(" ", "_") + ".csv"


class CsvMonitor(Monitor):
    def __init__(self, csv_config):
        super().__init__(csv_config)
        self.enabled = csv_config.enabled
        self.output_path = csv_config.output_path
        self.job_name = csv_config.job_name
        self.filenames: list = []  # the names this writer has headed (DeepSpeed's attribute)
        self._headed: Set[str] = set()
        self.log_dir = self.setup_log_dir()

    def setup_log_dir(self):
        """Makes and returns the folder on the writing rank; None elsewhere."""
        if not (self.enabled and writes_here()):
            return None
        log_dir = log_dir_of(self)
        os.makedirs(log_dir, exist_ok=True)
        return log_dir

    def write_events(self, event_list: Iterable[Event]) -> None:
        if self.log_dir is None:
            return
        for name, value, samples in event_list:
            file_name = csv_file_name(name)
            with open(os.path.join(self.log_dir, file_name), "a+", newline="") as f:
                writer = csv.writer(f)
                if file_name not in self._headed:
                    # DeepSpeed heads each file once per writer, a resumed run included.
                    self._headed.add(file_name)
                    self.filenames.append(file_name[: -len(".csv")])
                    writer.writerow(["step", name.split("/")[-1]])
                writer.writerow([samples, value])
