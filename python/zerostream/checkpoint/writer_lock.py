"""One live job writes a checkpoint folder (Note [Checkpoint folder ownership]).

Note [Checkpoint folder ownership]
  Two live jobs saving into one folder (a restarted job beside the orphaned ranks of the
  one before it, two launches given the same output_dir) overwrite each other's tags and
  `latest` in turn, and either may later resume from the other's state. So the process that
  commits a job's saves (its rank 0) holds an exclusive flock on `<save_dir>/.zerostream-
  writer` from its first save until it exits; the file names the holder (pid, host, the
  launcher's run id). A save from another process finds it held and fails on every rank,
  naming the folder and the holder (checkpoint/save.py turns rank 0's error into every
  rank's). The kernel drops the lock when the holder dies, so a crashed or killed job never
  blocks its restart. Within one process a folder is claimed once and kept (engines made one
  after another share it); claiming another folder gives up the previous one, so a run that
  saves into a new folder each time (the HF Trainer's checkpoint-N) holds one descriptor.
  Only writers lock: loading from a folder another job writes is allowed.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
from typing import Optional, Tuple

LOCK_NAME = ".zerostream-writer"

_held: Optional[Tuple[str, int]] = None  # (the folder's real path, the locked descriptor)


def _holder_text() -> str:
    run = os.environ.get("TORCHELASTIC_RUN_ID", "")
    return f"pid {os.getpid()} on host {socket.gethostname()}" + (f", run {run}" if run else "")


def claim(save_dir: str) -> None:
    """Makes this process the writer of `save_dir` (which exists), or raises OSError(EBUSY)
    naming the live job that is."""
    global _held
    real = os.path.realpath(save_dir)
    if _held is not None and _held[0] == real:
        return
    path = os.path.join(real, LOCK_NAME)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = os.pread(fd, 512, 0).decode(errors="replace").strip() or "unknown"
        finally:
            os.close(fd)
        raise OSError(
            errno.EBUSY,
            f"save_checkpoint: the checkpoint folder {save_dir} is being written by another "
            f"live job ({holder}); stop that job, or save this one elsewhere",
            save_dir,
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, (_holder_text() + "\n").encode(), 0)
    release()
    _held = (real, fd)


def release() -> None:
    """Gives up the folder this process writes (tests; a process's exit does it too)."""
    global _held
    if _held is not None:
        os.close(_held[1])
        _held = None
