"""`zerostream bench NAME`: each module here defines add_arguments(parser) and run(args) -> int."""

from __future__ import annotations

import contextlib
import os
import sys


@contextlib.contextmanager
def stdout_to_stderr(enabled: bool = True):
    """Sends everything written to stdout (Python objects and fd 1: peers' loggers, JIT build
    output) to stderr inside the block, so `--json` leaves exactly one JSON object on stdout."""
    if not enabled:
        yield
        return
    sys.stdout.flush()
    saved_fd = os.dup(1)
    saved_obj = sys.stdout
    try:
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        yield
    finally:
        sys.stdout.flush()
        sys.stdout = saved_obj
        os.dup2(saved_fd, 1)
        os.close(saved_fd)
